// Command lockside-example takes Lockside locks from Go; the cross-language test
// (tests/client_languages.rs) runs its modes as client processes.
//
//	lockside-example [--addr A] --key K [--hold D] [--wait D] [--ttl D]
//		take K, print the fencing token, hold it for D, release it.
//	lockside-example contend [--addr A] --key K --iterations N --out FILE
//		N times: take K (waiting up to 30 s), hold it 0-2 ms, release it, and
//		append "start_ns end_ns fencing_token" to FILE. Gives up after 60 s.
//	lockside-example elect [--addr A] --key K --value V [--rounds N] [--hold D] [--out FILE]
//		leader election: N times (1), campaign for K with value V, printing
//		who leads while waiting; lead: proclaim "V/ROUND", work for D (stopping
//		at once if leadership is suspended or lost), resign. With --out, append
//		"start_ns end_ns fencing_token" per term to FILE.
//	lockside-example watch [--addr A] --key K [--until V] [--out FILE]
//		follow the leader of K: one line per state; with --out, append
//		"mono_ns holders fencing_token value" lines. Stops after a leader whose
//		value is V.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lockside/lockside/clients/go"
)

const (
	contendWait    = 30 * time.Second
	contendTimeout = 60 * time.Second
)

func main() {
	var err error
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "contend":
		err = contend(os.Args[2:])
	case "elect":
		err = elect(os.Args[2:])
	case "watch":
		err = watch(os.Args[2:])
	default:
		err = hold(os.Args[1:])
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2) // the flag package has printed the usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockside-example:", err)
		os.Exit(1)
	}
}

func connect(ctx context.Context, addr string) (*lockside.Client, error) {
	return lockside.Connect(ctx, addr, lockside.WithClientName(fmt.Sprintf("lockside-example-go/%d", os.Getpid())))
}

// usable reports whether the lock may still be used: held, not suspended or lost.
func usable(l *lockside.Lock) bool {
	s := l.State()
	return s == lockside.Held || s == lockside.InJeopardy
}

// hold takes the lock once and keeps it for --hold.
func hold(args []string) error {
	fs := flag.NewFlagSet("lockside-example", flag.ContinueOnError)
	addr := fs.String("addr", "", "sidecar address, host:port or unix:/path (default $LOCKSIDE_ADDR, else 127.0.0.1:7420)")
	key := fs.String("key", "", "lock name (required)")
	holdFor := fs.Duration("hold", time.Second, "how long to hold the lock")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for a busy lock")
	ttl := fs.Duration("ttl", 0, "lock TTL in the store (0: the sidecar's default)")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := connect(ctx, *addr)
	if err != nil {
		return err
	}
	defer c.Close()
	lock, err := c.Lock(ctx, *key, lockside.WithWait(*wait), lockside.WithTTL(*ttl))
	if err != nil {
		return err
	}
	fmt.Printf("acquired %q fencing_token=%d ttl=%v\n", lock.Key(), lock.FencingToken(), lock.TTL())

	timer := time.NewTimer(*holdFor)
	defer timer.Stop()
holding:
	for {
		changed := lock.Changed() // before State: no change slips in between
		switch lock.State() {
		case lockside.Suspended:
			fmt.Println("suspended: the stream to the sidecar broke; not using the lock until it is restored")
		case lockside.Lost:
			return lock.Err()
		}
		select {
		case <-timer.C:
			break holding
		case <-ctx.Done():
			fmt.Println("interrupted, releasing early")
			break holding
		case <-changed:
		}
	}
	if err := lock.Unlock(context.Background()); err != nil {
		return err
	}
	fmt.Printf("released %q\n", lock.Key())
	return nil
}

// contend takes the lock --iterations times and records every hold in --out.
func contend(args []string) error {
	fs := flag.NewFlagSet("lockside-example contend", flag.ContinueOnError)
	addr := fs.String("addr", "", "sidecar address, host:port or unix:/path (default $LOCKSIDE_ADDR, else 127.0.0.1:7420)")
	key := fs.String("key", "", "lock name (required)")
	iterations := fs.Int("iterations", 50, "how many times to take the lock")
	out := fs.String("out", "", "file to append \"start_ns end_ns fencing_token\" lines to (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	f, err := appendTo(*out)
	if err != nil {
		return err
	}
	defer f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), contendTimeout)
	defer cancel()
	c, err := connect(ctx, *addr)
	if err != nil {
		return err
	}
	defer c.Close()

	for i := 0; i < *iterations; i++ {
		lock, err := c.Lock(ctx, *key, lockside.WithWait(contendWait))
		if err != nil {
			return fmt.Errorf("iteration %d: %w", i, err)
		}
		start := monotonicNs()
		time.Sleep(time.Duration(rand.Int64N(int64(2*time.Millisecond) + 1)))
		end := monotonicNs()
		if !usable(lock) {
			return fmt.Errorf("iteration %d: the lock was %s while in use", i, lock.State())
		}
		if err := lock.Unlock(ctx); err != nil {
			return fmt.Errorf("iteration %d: %w", i, err)
		}
		if _, err := fmt.Fprintf(f, "%d %d %d\n", start, end, lock.FencingToken()); err != nil {
			return err
		}
	}
	return f.Close()
}

// elect campaigns --rounds times; while waiting it prints who leads.
func elect(args []string) error {
	fs := flag.NewFlagSet("lockside-example elect", flag.ContinueOnError)
	addr := fs.String("addr", "", "sidecar address, host:port or unix:/path (default $LOCKSIDE_ADDR, else 127.0.0.1:7420)")
	key := fs.String("key", "", "election key (required)")
	value := fs.String("value", "", "this candidate's value: its name or address")
	rounds := fs.Int("rounds", 1, "how many terms to lead")
	holdFor := fs.Duration("hold", time.Second, "how long to lead each term")
	ttl := fs.Duration("ttl", 0, "leadership TTL in the store (0: the sidecar's default)")
	out := fs.String("out", "", "file to append \"start_ns end_ns fencing_token\" lines to, one per term")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	record, err := appendTo(*out)
	if err != nil {
		return err
	}
	defer record.Close()

	c, err := connect(ctx, *addr)
	if err != nil {
		return err
	}
	defer c.Close()

	for round := 1; round <= *rounds; round++ {
		// A follower watches who leads until it leads itself.
		wctx, stopWatching := context.WithCancel(ctx)
		go printLeaders(wctx, c, *key)
		lead, err := c.Campaign(ctx, *key, []byte(*value), lockside.WithTTL(*ttl))
		stopWatching()
		if err != nil {
			return fmt.Errorf("term %d: %w", round, err)
		}
		start := monotonicNs()
		fmt.Printf("leading %q as %q, fencing_token=%d\n", *key, *value, lead.FencingToken())
		if err := lead.Proclaim(ctx, fmt.Appendf(nil, "%s/%d", *value, round)); err != nil {
			return fmt.Errorf("term %d: proclaim: %w", round, err)
		}
		changed := lead.Changed()
		if !usable(lead.Lock) {
			return fmt.Errorf("term %d: leadership %s", round, lead.State())
		}
		timer := time.NewTimer(*holdFor) // the work a leader does
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return lead.Resign(context.Background())
		case <-changed:
			// Suspended or lost: stop leading at once (a jeopardy would be
			// survivable, but this program keeps it simple).
			timer.Stop()
			return fmt.Errorf("term %d: leadership %s", round, lead.State())
		}
		end := monotonicNs()
		if err := lead.Resign(ctx); err != nil {
			return fmt.Errorf("term %d: resign: %w", round, err)
		}
		if record != nil {
			if _, err := fmt.Fprintf(record, "%d %d %d\n", start, end, lead.FencingToken()); err != nil {
				return err
			}
		}
	}
	return nil
}

// printLeaders prints each leader of key until ctx ends.
func printLeaders(ctx context.Context, c *lockside.Client, key string) {
	states, err := c.Watch(ctx, key)
	if err != nil {
		return
	}
	for state := range states {
		if h, ok := state.Leader(); ok {
			fmt.Printf("leader of %q: %q (fencing_token=%d)\n", key, h.Value, h.FencingToken)
		} else {
			fmt.Printf("no leader of %q\n", key)
		}
	}
}

// watch follows the leader of --key until one whose value is --until.
func watch(args []string) error {
	fs := flag.NewFlagSet("lockside-example watch", flag.ContinueOnError)
	addr := fs.String("addr", "", "sidecar address, host:port or unix:/path (default $LOCKSIDE_ADDR, else 127.0.0.1:7420)")
	key := fs.String("key", "", "election key (required)")
	until := fs.String("until", "", "stop after a leader with this value (empty: until interrupted)")
	out := fs.String("out", "", "file to append \"mono_ns holders fencing_token value\" lines to")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *until != "" {
		// Waiting for a given leader (as tests do): give up after a minute.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, contendTimeout)
		defer cancel()
	}
	record, err := appendTo(*out)
	if err != nil {
		return err
	}
	defer record.Close()

	c, err := connect(ctx, *addr)
	if err != nil {
		return err
	}
	defer c.Close()
	states, err := c.Watch(ctx, *key)
	if err != nil {
		return err
	}
	for state := range states {
		h, ok := state.Leader()
		if ok {
			fmt.Printf("leader of %q: %q (fencing_token=%d)\n", *key, h.Value, h.FencingToken)
		} else {
			fmt.Printf("no leader of %q\n", *key)
		}
		if record != nil {
			line := fmt.Sprintf("%d %d %d %s\n", monotonicNs(), len(state.Holders), h.FencingToken, h.Value)
			if _, err := record.WriteString(line); err != nil {
				return err
			}
		}
		if ok && *until != "" && string(h.Value) == *until {
			return nil
		}
	}
	if ctx.Err() != nil && *until == "" {
		return nil // interrupted
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("watch %q: %w", *key, err)
	}
	return fmt.Errorf("watch %q: the stream ended", *key)
}

// appendTo opens the record file path for appending (nil, and no error, for "").
func appendTo(path string) (*os.File, error) {
	if path == "" {
		return nil, nil
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if fs.Lookup("key").Value.String() == "" {
		return errors.New("--key is required")
	}
	return nil
}

// monotonicNs reads CLOCK_MONOTONIC: one clock for every process on the machine, so
// holds recorded by different programs can be compared.
func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now().UnixNano()
	}
	return ts.Nano()
}
