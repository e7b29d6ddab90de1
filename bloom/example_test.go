package bloom_test

import (
	"fmt"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
)

func ExampleBuild() {
	// The owner: keys its vLLM holds, sized from its KV capacity.
	held := []blockkey.Key{0x9e3779b97f4a7c15, 0x3c6ef372fe94f82a, 0xdaa66d2c7ddf743f}
	d := bloom.Build(bloom.Header{
		KeyScheme: blockkey.Version,
		Node:      "vllm-0",
		Epoch:     1,
		Version:   42,
		Params:    bloom.ParamsFor(25_000, 0.01),
	}, held)
	wire, err := d.MarshalBinary()
	if err != nil {
		fmt.Println(err)
		return
	}

	// A peer: decode, then match a request's key chain, whose third block
	// the owner does not hold.
	peer, err := bloom.Unmarshal(wire)
	if err != nil {
		fmt.Println(err)
		return
	}
	request := []blockkey.Key{held[0], held[1], 0x1234, held[2]}
	h := peer.Header()
	fmt.Printf("%s epoch %d version %d: %d keys, %d bytes\n", h.Node, h.Epoch, h.Version, peer.Len(), len(wire))
	fmt.Println("prefix blocks cached:", peer.PrefixLen(request))
	// Output:
	// vllm-0 epoch 1 version 42: 3 keys, 31026 bytes
	// prefix blocks cached: 2
}
