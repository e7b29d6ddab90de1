package route

import "testing"

func TestPickRank(t *testing.T) {
	cfg := DefaultConfig() // LoadTokens 64, QueuedWeight 0.5
	tests := []struct {
		name                 string
		ranks                []RankLoad
		pinned, work, prompt int
		want                 int
	}{
		{"idle pod: the pinned rank", []RankLoad{{}, {}}, 1, 100, 4100, 1},
		{"no pin: the least loaded", []RankLoad{{Serving: 2}, {Serving: 1}}, NoRank, 4100, 4100, 1},
		{"no pin, a tie: the lowest", []RankLoad{{}, {}}, NoRank, 500, 500, 0},
		// Rank 0 holds 4000 of 4100 tokens. Four hits queued there cost
		// 4*64 + 0.5*400 = 456 tokens of wait: far less than the 4000
		// it saves.
		{"a few hits queued at the holder: stays",
			[]RankLoad{{Serving: 4, Queued: 400}, {}}, 0, 100, 4100, 0},
		// 12000 tokens of new prompts queued at rank 0: a wait of
		// 64 + 6000 tokens, more than the 4000 the prefix saves.
		{"a long queue at the holder: another rank",
			[]RankLoad{{Serving: 1, Queued: 12000}, {Serving: 1}}, 0, 100, 4100, 1},
		{"equal cost: the pinned rank",
			[]RankLoad{{Serving: 1, Queued: 8000}, {Serving: 1}}, 0, 100, 4100, 0},
		{"just past equal: the other rank",
			[]RankLoad{{Serving: 1, Queued: 8002}, {Serving: 1}}, 0, 100, 4100, 1},
		{"the other rank busier still: stays",
			[]RankLoad{{Serving: 1, Queued: 12000}, {Serving: 3, Queued: 9000}}, 0, 100, 4100, 0},
		{"three ranks: the one with room",
			[]RankLoad{{Queued: 20000}, {Serving: 2, Queued: 3000}, {Serving: 1}}, 0, 100, 4100, 2},
		{"negative counts read as 0", []RankLoad{{Serving: -3}, {Serving: -1, Queued: -5}}, 1, 10, 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cfg.PickRank(tt.ranks, tt.pinned, tt.work, tt.prompt); got != tt.want {
				t.Errorf("PickRank = %d, want %d", got, tt.want)
			}
		})
	}
}

// The pick ranks by the wait Affinity prices pods with: with the queued
// work weighed at 0 (--route-load=requests) only requests count.
func TestPickRankFollowsQueuedWeight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.QueuedWeight = 0
	ranks := []RankLoad{{Serving: 1, Queued: 50000}, {Serving: 1}}
	if got := cfg.PickRank(ranks, 0, 100, 4100); got != 0 {
		t.Errorf("queued work ignored: PickRank = %d, want the holder 0", got)
	}
	cfg.QueuedWeight = 0.5
	if got := cfg.PickRank(ranks, 0, 100, 4100); got != 1 {
		t.Errorf("queued work weighed: PickRank = %d, want 1", got)
	}
}
