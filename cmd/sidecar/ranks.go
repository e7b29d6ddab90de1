package main

import "github.com/rs/zerolog"

// rankCheck holds the pod's data-parallel rank count to what its vLLM
// runs. --kv-events-dp-ranks says how many ranks to subscribe to, and the
// count is advertised to peers (who pin requests to a rank within it) and
// used by the front (which names a rank on every request): a rank vLLM
// does not run is a 400 for every request sent there. vLLM's gauges name
// one engine per rank, so a scrape that names fewer than the flag lowers
// the count used to theirs, loudly; one that names none (an older vLLM,
// one rank) changes nothing.
type rankCheck struct {
	flag int
	set  func(n int) // the count in use: the mesh's advert and the front's
	log  zerolog.Logger

	used int // 0 until the first scrape that names engines
}

// observe takes the engines a scrape of vLLM's /metrics named.
func (c *rankCheck) observe(engines int) {
	if engines <= 0 || c.flag <= 1 {
		return
	}
	n := min(c.flag, engines)
	if n == c.used {
		return
	}
	if n < c.flag {
		c.log.Warn().Int("kv_events_dp_ranks", c.flag).Int("engines", engines).
			Msg("--kv-events-dp-ranks is above the engines vLLM's metrics name (its --data-parallel-size?): requests are pinned and placed only on the ranks it runs")
	} else if c.used != 0 {
		c.log.Info().Int("ranks", n).Msg("vLLM's metrics name every rank again")
	}
	c.used = n
	c.set(n)
}
