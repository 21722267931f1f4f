package main

import (
	"context"
	"errors"
	"io"
)

// runLoad runs `idem load`. The load engine lands in internal/load.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return failure(stderr, "idem load", errors.New("not built yet"))
}
