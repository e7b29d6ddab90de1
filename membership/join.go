package membership

import (
	"context"
	"math/rand/v2"
	"net"
	"time"
)

const (
	defaultGossipPort = "7946"
	resolveTimeout    = 5 * time.Second
	firstBackoff      = time.Second
)

// joiner joins the seeds: once at start, then with backoff until it reaches
// someone, then every RejoinInterval, each time only the seed addresses that
// are not live members. memberlist never heals a partition by itself
// (docs/reference/libraries.md §1.9); this does. After the first join it
// settles: twice it joins every seed, live or not (Config.Settle).
type joiner struct {
	ms       *Members
	seeds    []string
	resolver Resolver
	rng      *rand.Rand          // used by the join goroutine only
	last     map[string][]string // seed → addresses last resolved, reused when DNS fails
}

// loop runs the join schedule: a first attempt at once, whose result goes to
// first (buffered), then retries and settles. ctx, cancelled by Shutdown,
// ends seed lookups in progress. It returns when Shutdown closes done, or
// after the first successful join and its settles when RejoinInterval is 0.
func (j *joiner) loop(ctx context.Context, first chan<- bool) {
	defer j.ms.wg.Done()
	joined := j.attempt(ctx, false)
	first <- joined
	every := j.ms.cfg.RejoinInterval
	backoff := firstBackoff
	var settles []time.Duration // waits before the settles still to come
	if s := j.ms.cfg.Settle; s > 0 {
		settles = []time.Duration{s, 3 * s} // at Settle and 4×Settle after the first join
	}
	for {
		var wait time.Duration
		settle := joined && len(settles) > 0
		switch {
		case settle:
			wait = settles[0]
			settles = settles[1:]
		case !joined:
			wait = backoff
			backoff = nextBackoff(backoff, every)
		case every > 0:
			wait = every
		default:
			return
		}
		t := time.NewTimer(jitter(wait, j.rng.Float64()))
		select {
		case <-j.ms.done:
			t.Stop()
			return
		case <-t.C:
		}
		ok := j.attempt(ctx, settle)
		joined = joined || ok
	}
}

// nextBackoff doubles b up to limit (30 s when limit is 0).
func nextBackoff(b, limit time.Duration) time.Duration {
	if limit <= 0 {
		limit = 30 * time.Second
	}
	return min(2*b, max(limit, firstBackoff))
}

// jitter spreads d over ±20%, f being uniform in [0, 1), so that pods
// started together do not rejoin in lockstep.
func jitter(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*f))
}

// attempt resolves the seeds and joins those that are not live members, or
// every one when all is set (a settle). It reports false only when there
// were addresses to join and none answered.
func (j *joiner) attempt(ctx context.Context, all bool) bool {
	if len(j.seeds) == 0 {
		return true
	}
	ml := j.ms.ml
	live := j.ms.addrs()
	self, _ := j.ms.Self()
	var todo []string
	for _, a := range j.resolve(ctx) {
		if a != self.Addr && (all || !live[a]) {
			todo = append(todo, a)
		}
	}
	if len(todo) == 0 {
		return true
	}
	j.ms.joinAttempts.Add(1)
	n, err := ml.Join(todo)
	if n == 0 {
		j.ms.joinFailures.Add(1)
		j.ms.log.Debug().Err(err).Strs("seeds", todo).Msg("join reached no one")
		return false
	}
	j.ms.log.Debug().Int("contacted", n).Int("members", ml.NumMembers()).Msg("joined")
	return true
}

// resolve turns the seeds into ip:port addresses, keeping a seed's previous
// addresses when its lookup fails.
func (j *joiner) resolve(ctx context.Context) []string {
	var addrs []string
	for _, seed := range j.seeds {
		host, port, err := net.SplitHostPort(seed)
		if err != nil {
			host, port = seed, defaultGossipPort
		}
		if net.ParseIP(host) != nil {
			addrs = append(addrs, net.JoinHostPort(host, port))
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		ips, err := j.resolver.LookupHost(lctx, host)
		cancel()
		if err != nil {
			j.ms.log.Debug().Err(err).Str("seed", seed).Msg("resolve seed")
			addrs = append(addrs, j.last[seed]...)
			continue
		}
		var got []string
		for _, ip := range ips {
			got = append(got, net.JoinHostPort(ip, port))
		}
		j.last[seed] = got
		addrs = append(addrs, got...)
	}
	return addrs
}
