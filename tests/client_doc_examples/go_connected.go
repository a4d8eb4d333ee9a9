// A Go fragment that uses an open client `c` (and `ctx`), inside a function that
// returns an error: tests/client_doc_examples.rs puts it in place of the EXAMPLE line
// and builds the program against clients/go.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	lockside "github.com/lockside/lockside/clients/go"
)

var _ = fmt.Println

func run(ctx context.Context) error {
	c, err := lockside.Connect(ctx, "") // $LOCKSIDE_ADDR
	if err != nil {
		return err
	}
	defer c.Close()
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
