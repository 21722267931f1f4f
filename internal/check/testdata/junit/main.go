// A JUnit XML consumer for the tests of `idem check --junit` (internal/check,
// junit_test.go): it reads a report with github.com/joshdk/go-junit, the parser that
// Go CI tools use to ingest JUnit files, and prints what it understood as JSON, one
// object per testcase. Its own module, so that idem's go.mod does not require the
// parser; the test builds it with the go command.
//
//	go run . FILE
package main

import (
	"encoding/json"
	"log"
	"os"

	"github.com/joshdk/go-junit"
)

type testcase struct {
	Suite     string `json:"suite"`
	Name      string `json:"name"`
	Classname string `json:"classname"`
	Status    string `json:"status"`
	Message   string `json:"message,omitempty"`
	Type      string `json:"type,omitempty"`
	Output    string `json:"output,omitempty"`
}

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: junit FILE")
	}
	suites, err := junit.IngestFile(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	var out []testcase
	for _, s := range suites {
		for _, t := range s.Tests {
			c := testcase{Suite: s.Name, Name: t.Name, Classname: t.Classname, Status: string(t.Status), Output: t.SystemOut}
			if t.Error != nil {
				c.Message = t.Error.Error()
			}
			if e, ok := t.Error.(junit.Error); ok {
				c.Message, c.Type = e.Message, e.Type
			}
			out = append(out, c)
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		log.Fatal(err)
	}
}
