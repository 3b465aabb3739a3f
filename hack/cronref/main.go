// cronref prints the instants robfig/cron v3's ParseStandard (the parser Kubernetes CronJob uses)
// gives each schedule read from stdin, one schedule per line, for the differential test in
// controller/tests/cron_differential.rs. Output, one line per input line: "ERR <message>", or the
// next N instants after the start as Unix seconds (0 where robfig finds none within its 5 years).
//
// Usage: cronref <start-unix-seconds> <n> < schedules
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: cronref <start-unix-seconds> <n> < schedules")
		os.Exit(2)
	}
	start, err1 := strconv.ParseInt(os.Args[1], 10, 64)
	n, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "cronref: start and n must be whole numbers, n at least 1")
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		sched, err := cron.ParseStandard(in.Text())
		if err != nil {
			fmt.Fprintf(out, "ERR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		t := time.Unix(start, 0).UTC()
		instants := make([]string, 0, n)
		for i := 0; i < n; i++ {
			t = sched.Next(t)
			if t.IsZero() {
				instants = append(instants, "0")
				break
			}
			instants = append(instants, strconv.FormatInt(t.Unix(), 10))
		}
		fmt.Fprintln(out, strings.Join(instants, " "))
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "cronref:", err)
		os.Exit(1)
	}
}
