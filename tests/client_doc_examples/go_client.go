// A Go fragment inside a function that returns an error, with `ctx` and the stand-ins
// `store`, `data` and `ledger` in scope: tests/client_doc_examples.rs puts it in place of the
// EXAMPLE line, builds the program against clients/go and runs it ($LOCKSIDE_ADDR).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	lockside "github.com/lockside/lockside/clients/go"
)

var (
	_ = errors.Is
	_ = fmt.Println
	_ = lockside.ErrNotAcquired
)

// A resource that takes the fencing token with every write.
type resource struct{}

func (resource) Write(data []byte, fencingToken uint64) error {
	fmt.Printf("wrote %d bytes with fencing token %d\n", len(data), fencingToken)
	return nil
}

// Accounts whose every write carries the fencing token of the account's key.
type accounts map[string]int

func (a accounts) Add(name string, amount int, fencingToken uint64) error {
	a[name] += amount
	fmt.Printf("%s: %+d with fencing token %d, balance %d\n", name, amount, fencingToken, a[name])
	return nil
}

var (
	store  resource
	data   = []byte("the report")
	ledger = accounts{"alice": 100, "bob": 0}
)

func run(ctx context.Context) error {
	// EXAMPLE
	return nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}
