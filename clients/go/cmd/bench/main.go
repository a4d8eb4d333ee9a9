// Command bench measures this client against a running sidecar and its Redis, and
// prints what it measured; it is not a test (nothing is asserted):
//
//	bench --addr 127.0.0.1:7420 --redis 127.0.0.1:6379 [-n 2000] [--kills 20]
//	      [--handoff 5s] [--handoff-only]
//
// First, uncontended lock + unlock round trips through the sidecar with this client,
// p50 and p99, beside the classic recipe on the same Redis with go-redis (SET key
// token NX PX ttl, then a Lua compare-and-delete). Then kill -> grant: a holder
// process is SIGKILLed while this process waits for its key, and the time from the
// kill to the waiter's grant is measured (the sidecar sees the stream end and
// releases at once; with the classic recipe the key would stay until its TTL).
// Last, handoff between 8 goroutines in two processes (handoff.go): this client,
// unfair and fair, beside the classic recipe retrying SET NX every 1 ms.
//
// The sidecar must use that Redis (`lockside serve --store redis://HOST:PORT`). The
// program is a module of its own, so that go-redis stays out of the client
// library's dependencies.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockside/lockside/clients/go"
)

const ttl = 10 * time.Second

// compareAndDelete releases the classic lock only if it still carries our token.
var compareAndDelete = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		hold(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "handoff-child" {
		handoffChild(os.Args[2:])
		return
	}
	addr := flag.String("addr", "127.0.0.1:7420", "the sidecar")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "the sidecar's Redis")
	n := flag.Int("n", 2000, "lock + unlock cycles per client")
	kills := flag.Int("kills", 20, "holders to kill")
	handoff := flag.Duration("handoff", 5*time.Second, "handoff run per variant (0: skip)")
	handoffOnly := flag.Bool("handoff-only", false, "run the handoff alone")
	flag.Parse()
	ctx := context.Background()
	self, err := os.Executable()
	check(err)
	if *handoffOnly {
		runHandoff(self, *addr, *redisAddr, *handoff)
		return
	}

	c, err := lockside.Connect(ctx, *addr)
	check(err)
	defer c.Close()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer rdb.Close()
	check(rdb.Ping(ctx).Err())
	check(compareAndDelete.Load(ctx, rdb).Err())

	fmt.Printf("uncontended lock + unlock, %d cycles (ms)\n", *n)
	report("lockside (this client)", measure(*n, func() {
		l, err := c.Lock(ctx, "bench/lockside", lockside.WithWait(0))
		check(err)
		check(l.Unlock(ctx))
	}))
	token := make([]byte, 16)
	report("go-redis SET NX PX + Lua CAD", measure(*n, func() {
		_, err := rand.Read(token)
		check(err)
		t := hex.EncodeToString(token)
		ok, err := rdb.SetNX(ctx, "bench/classic", t, ttl).Result()
		check(err)
		if !ok {
			check(fmt.Errorf("bench/classic is held"))
		}
		check(compareAndDelete.Run(ctx, rdb, []string{"bench/classic"}, t).Err())
	}))

	fmt.Printf("kill -> grant, %d holders SIGKILLed (ms)\n", *kills)
	var took []time.Duration
	for i := 0; i < *kills; i++ {
		key := fmt.Sprintf("bench/kill/%d", i)
		holder := exec.Command(self, "hold", "--addr", *addr, "--key", key)
		out, err := holder.StdoutPipe()
		check(err)
		check(holder.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		check(err)
		if strings.TrimSpace(line) != "held" {
			check(fmt.Errorf("holder said %q", line))
		}
		granted := make(chan time.Time, 1)
		unlocked := make(chan struct{})
		go func() {
			defer close(unlocked)
			l, err := c.Lock(ctx, key, lockside.WithWait(30*time.Second))
			check(err)
			granted <- time.Now()
			check(l.Unlock(ctx))
		}()
		for { // the waiter is queued before the kill
			st, err := c.Describe(ctx, key)
			check(err)
			if st.Waiters > 0 {
				break
			}
		}
		killed := time.Now()
		check(holder.Process.Kill())
		took = append(took, (<-granted).Sub(killed))
		<-unlocked
		holder.Wait()
	}
	report("lockside: holder killed -> waiter granted", took)
	fmt.Printf("  (the classic recipe: a killed holder's key stays until its TTL, %v here)\n", ttl)
	if *handoff > 0 {
		runHandoff(self, *addr, *redisAddr, *handoff)
	}
}

// hold is the child process: take the key, say so, wait to be killed.
func hold(args []string) {
	fs := flag.NewFlagSet("hold", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:7420", "the sidecar")
	key := fs.String("key", "", "the key")
	check(fs.Parse(args))
	ctx := context.Background()
	c, err := lockside.Connect(ctx, *addr)
	check(err)
	_, err = c.Lock(ctx, *key)
	check(err)
	fmt.Println("held")
	select {}
}

func measure(n int, cycle func()) []time.Duration {
	for i := 0; i < n/10; i++ { // warm up: connections, scripts, caches
		cycle()
	}
	out := make([]time.Duration, n)
	for i := range out {
		start := time.Now()
		cycle()
		out[i] = time.Since(start)
	}
	return out
}

func report(name string, d []time.Duration) {
	slices.Sort(d)
	at := func(q float64) float64 {
		return float64(d[min(len(d)-1, int(q*float64(len(d))))].Microseconds()) / 1000
	}
	fmt.Printf("  %-44s p50 %7.3f  p99 %7.3f  max %7.3f\n", name, at(0.50), at(0.99), at(1))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
