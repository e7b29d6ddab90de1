package scale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
)

// Request is one prompt of a trace: its blocks as prefix-unique ids
// (Mooncake's hash_ids: equal ids mean an equal prefix up to that block).
type Request struct {
	HashIDs []uint64 `json:"hash_ids"`
}

// ReadTrace reads a Mooncake JSON-lines trace (one object with hash_ids a
// line). Lines without hash_ids are skipped.
func ReadTrace(r io.Reader) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		var q Request
		if err := json.Unmarshal(sc.Bytes(), &q); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if len(q.HashIDs) > 0 {
			out = append(out, q)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return out, nil
}

// Subdivide returns reqs with each id split into per ids, its prefix's
// next per pieces: a Mooncake trace's 512-token blocks as the harness's
// units (one routing key's blocks, Config.RoutingStride of 16 tokens), 8
// each at stride 4. Piece j of id is id·per+j, so equal ids still mean an
// equal prefix, and a request's new blocks are per times as many.
func Subdivide(reqs []Request, per int) []Request {
	if per <= 1 {
		return reqs
	}
	out := make([]Request, len(reqs))
	for i, q := range reqs {
		ids := make([]uint64, 0, len(q.HashIDs)*per)
		for _, id := range q.HashIDs {
			for j := range per {
				ids = append(ids, id*uint64(per)+uint64(j))
			}
		}
		out[i] = Request{HashIDs: ids}
	}
	return out
}

// Synthetic returns n requests with shared prefixes, seeded: a few system
// prompts, each with conversations that grow turn by turn, the shape of
// Mooncake's conversation trace without its file.
func Synthetic(n int, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, 1))
	next := uint64(0)
	fresh := func(k int) []uint64 {
		ids := make([]uint64, k)
		for i := range ids {
			ids[i] = next
			next++
		}
		return ids
	}
	systems := make([][]uint64, 8)
	for i := range systems {
		systems[i] = fresh(2 + rng.IntN(6))
	}
	var convs [][]uint64
	out := make([]Request, 0, n)
	for len(out) < n {
		if len(convs) == 0 || rng.IntN(3) == 0 { // a new conversation
			sys := systems[rng.IntN(len(systems))]
			convs = append(convs, append(append([]uint64(nil), sys...), fresh(1+rng.IntN(8))...))
			if len(convs) > 256 {
				convs = convs[1:]
			}
		} else { // the next turn of a live one
			i := rng.IntN(len(convs))
			convs[i] = append(convs[i], fresh(1+rng.IntN(4))...)
			if len(convs[i]) > 120 {
				convs[i] = convs[i][:len(convs[i])-4]
			}
		}
		c := convs[len(convs)-1]
		if rng.IntN(3) != 0 {
			c = convs[rng.IntN(len(convs))]
		}
		out = append(out, Request{HashIDs: append([]uint64(nil), c...)})
	}
	return out
}
