package kvindex

import "github.com/kvroute/kvroute/kvevent"

// eventExtras returns the extra hash keys of each of the first n blocks of
// a BlockStored event as blockkey.Extend takes them, or nil when no block
// has any (every event of a vLLM before #33304, and most events after).
//
// vLLM's tuple is lora_keys + mm_keys + cache_salt_keys (+ prompt-embeds
// hashes; vllm-interface.md §4.2). The LoRA name is already in the chain's
// root (blockkey.ModelRoot), so it is dropped; a multimodal item is its
// identifier, whether sent bare (v0.18+) or as an (identifier, offset)
// pair; the salt and anything else are kept as strings. The request side
// builds the same list (blockkey.BlockExtras). A shape it cannot read
// (an integer LoRA id, a map) is dropped: with it a key could only stop
// matching, never match what it should not.
func eventExtras(ev *kvevent.Event, n int) [][]string {
	if len(ev.ExtraKeys) == 0 {
		return nil
	}
	lora := ""
	if ev.LoRAName != nil {
		lora = *ev.LoRAName
	}
	var out [][]string
	for i := 0; i < n && i < len(ev.ExtraKeys); i++ {
		var keys []string
		dropped := false
		for _, x := range ev.ExtraKeys[i] {
			s, ok := extraString(x)
			if !ok {
				continue
			}
			if !dropped && lora != "" && s == lora {
				dropped = true // the LoRA name comes first, once
				continue
			}
			keys = append(keys, s)
		}
		if len(keys) == 0 {
			continue
		}
		if out == nil {
			out = make([][]string, n)
		}
		out[i] = keys
	}
	return out
}

// extraString reads one extra key: a string, bytes (a prompt-embeds
// hash), or a multimodal (identifier, offset) pair.
func extraString(x any) (string, bool) {
	switch v := x.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case []any:
		if len(v) > 0 {
			if s, ok := v[0].(string); ok {
				return s, true
			}
		}
	}
	return "", false
}
