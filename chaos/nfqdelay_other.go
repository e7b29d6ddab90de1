//go:build !linux

package chaos

import (
	"errors"
	"time"
)

type delayer struct{}

func startDelayer(string, uint16, time.Duration) (*delayer, error) {
	return nil, errors.New("gossip delay needs Linux")
}

func (*delayer) Close() {}
