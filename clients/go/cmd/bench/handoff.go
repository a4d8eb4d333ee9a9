package main

// Handoff between 8 goroutines in two processes: two child processes (this program,
// `bench handoff-child ...`), 4 goroutines each, all contending for one key in a loop
// (lock, a ~10 µs busy critical section, unlock) for a fixed time. Every cycle is
// stamped with wall-clock time, time.Now().UnixNano() (CLOCK_REALTIME: one clock for
// both processes of this machine), when the goroutine asked (req), was granted
// (grant) and called unlock (unlock). The parent merges both children's cycles in
// grant order and reports the handoff latency (a holder's unlock call to the next
// holder's grant) and the self-reacquire share: of the handoffs where another
// goroutine (another process) was already waiting when the holder called unlock, the
// share that went back to the same goroutine (the same process).

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockside/lockside/clients/go"
)

const (
	processes  = 2
	goroutines = 4
	spinRetry  = time.Millisecond // the classic recipe's retry interval
)

var variants = []string{"lockside", "lockside-fair", "go-redis-spin-1ms"}

type cycle struct {
	proc, g            int
	req, grant, unlock int64
}

func (c cycle) who() int { return c.proc*goroutines + c.g }

func runHandoff(self, addr, redisAddr string, d time.Duration) {
	fmt.Printf("handoff: %d processes x %d goroutines on one key, %v per variant, critical section ~10 µs;"+
		" wall clock (time.Now().UnixNano)\n", processes, goroutines, d)
	fmt.Printf("  %-18s %7s %6s | %-22s | %-24s | %8s %9s | %s\n", "", "grants", "/s", "handoff all p50/p99 ms",
		"to another p50/p99/max", "same g", "same proc", "grants per goroutine min..max")
	for _, v := range variants {
		cycles := measureHandoff(self, v, addr, redisAddr, "bench/handoff-"+v, d)
		reportHandoff(v, cycles, d)
	}
}

func measureHandoff(self, variant, addr, redisAddr, key string, d time.Duration) []cycle {
	var children []*exec.Cmd
	var stdins []io.WriteCloser
	var outs []*bufio.Reader
	for p := range processes {
		child := exec.Command(self, "handoff-child", variant, addr, redisAddr, key, strconv.Itoa(p))
		child.Stderr = os.Stderr
		in, err := child.StdinPipe()
		check(err)
		out, err := child.StdoutPipe()
		check(err)
		check(child.Start())
		defer child.Process.Kill()
		children, stdins, outs = append(children, child), append(stdins, in), append(outs, bufio.NewReader(out))
	}
	for _, out := range outs {
		line, err := out.ReadString('\n')
		check(err)
		if line != "ready\n" {
			check(fmt.Errorf("%s: child said %q", variant, line))
		}
	}
	deadline := time.Now().Add(d).UnixNano()
	for _, in := range stdins {
		_, err := fmt.Fprintf(in, "go %d\n", deadline)
		check(err)
	}
	var all []cycle
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, out := range outs {
		wg.Go(func() {
			var mine []cycle
			for {
				line, err := out.ReadString('\n')
				check(err)
				if line == "done\n" {
					break
				}
				var c cycle
				_, err = fmt.Sscanf(line, "%d %d %d %d %d", &c.proc, &c.g, &c.req, &c.grant, &c.unlock)
				check(err)
				mine = append(mine, c)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, child := range children {
		child.Wait()
	}
	slices.SortFunc(all, func(a, b cycle) int { return cmp.Compare(a.grant, b.grant) })
	return all
}

func reportHandoff(variant string, c []cycle, d time.Duration) {
	var all, toOther []time.Duration
	waitedG, sameG, waitedProc, sameProc := 0, 0, 0, 0
	for i := 0; i+1 < len(c); i++ {
		from, to := c[i], c[i+1]
		h := time.Duration(to.grant - from.unlock)
		all = append(all, h)
		if to.who() != from.who() {
			toOther = append(toOther, h)
		}
		// Who was waiting when `from` called unlock: each goroutine's next cycle after
		// i, if it had asked by then (a goroutine has one request at a time).
		var seen [processes * goroutines]bool
		otherG, otherProc := false, false
		for j, left := i+1, len(seen); j < len(c) && left > 0; j++ {
			w := c[j]
			if seen[w.who()] {
				continue
			}
			seen[w.who()] = true
			left--
			if w.who() != from.who() && w.req < from.unlock {
				otherG = true
				otherProc = otherProc || w.proc != from.proc
			}
		}
		if otherG {
			waitedG++
			if to.who() == from.who() {
				sameG++
			}
		}
		if otherProc {
			waitedProc++
			if to.proc == from.proc {
				sameProc++
			}
		}
	}
	var per [processes * goroutines]int
	for _, x := range c {
		per[x.who()]++
	}
	slices.Sort(per[:])
	fmt.Printf("  %-18s %7d %6d | %9s / %9s   | %s | %7.1f%% %8.1f%% | %d..%d\n", variant, len(c),
		int(float64(len(c))/d.Seconds()), msAt(all, 0.5), msAt(all, 0.99),
		msAt(toOther, 0.5)+" / "+msAt(toOther, 0.99)+" / "+msAt(toOther, 1),
		100*float64(sameG)/float64(max(1, waitedG)), 100*float64(sameProc)/float64(max(1, waitedProc)),
		per[0], per[len(per)-1])
}

func msAt(d []time.Duration, q float64) string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("%.3f", float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds())/1000)
}

// handoffChild is one child process: 4 goroutines on one key until the deadline
// the parent sends; args: VARIANT SIDECAR REDIS KEY PROC.
func handoffChild(args []string) {
	fs := flag.NewFlagSet("handoff-child", flag.ExitOnError)
	check(fs.Parse(args))
	variant, addr, redisAddr, key := fs.Arg(0), fs.Arg(1), fs.Arg(2), fs.Arg(3)
	proc, err := strconv.Atoi(fs.Arg(4))
	check(err)
	ctx := context.Background()
	var lock func() (unlock func())
	switch variant {
	case "lockside", "lockside-fair":
		c, err := lockside.Connect(ctx, addr)
		check(err)
		var opts []lockside.LockOption
		if variant == "lockside-fair" {
			opts = append(opts, lockside.Fair())
		}
		lock = func() func() {
			l, err := c.Lock(ctx, key, opts...)
			check(err)
			return func() { check(l.Unlock(ctx)) }
		}
	case "go-redis-spin-1ms":
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: goroutines})
		check(compareAndDelete.Load(ctx, rdb).Err())
		lock = func() func() {
			token := make([]byte, 16)
			_, err := rand.Read(token)
			check(err)
			t := hex.EncodeToString(token)
			for {
				ok, err := rdb.SetNX(ctx, key, t, ttl).Result()
				check(err)
				if ok {
					return func() { check(compareAndDelete.Run(ctx, rdb, []string{key}, t).Err()) }
				}
				time.Sleep(spinRetry)
			}
		}
	default:
		check(fmt.Errorf("unknown variant %q", variant))
	}
	for range 200 { // warm up: connections, scripts
		lock()()
	}
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	check(err)
	deadline, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "go ")), 10, 64)
	check(err)
	stamps := make([][]cycle, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for {
				req := time.Now().UnixNano()
				if req >= deadline {
					return
				}
				unlock := lock()
				grant := time.Now().UnixNano()
				for time.Now().UnixNano()-grant < 10_000 { // the critical section
				}
				at := time.Now().UnixNano()
				unlock()
				stamps[g] = append(stamps[g], cycle{proc, g, req, grant, at})
			}
		})
	}
	wg.Wait()
	w := bufio.NewWriter(os.Stdout)
	for _, mine := range stamps {
		for _, c := range mine {
			fmt.Fprintf(w, "%d %d %d %d %d\n", c.proc, c.g, c.req, c.grant, c.unlock)
		}
	}
	fmt.Fprintln(w, "done")
	check(w.Flush())
}
