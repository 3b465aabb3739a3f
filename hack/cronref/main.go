// cronref prints the instants robfig/cron v3's ParseStandard (the parser Kubernetes CronJob uses)
// gives each schedule read from stdin, for the differential test in
// controller/tests/cron_differential.rs. One output line per input line: "ERR <message>", or
// instants as Unix seconds.
//
//	cronref <start-unix-seconds> <n> < schedules
//	    the next n instants after start in UTC (a trailing 0 where robfig finds none within its
//	    five-year search), one schedule per input line.
//	cronref window < lines
//	    each input line is "<zone> <start> <end> <schedule>": every instant in (start, end],
//	    with the schedule read in the IANA zone (Go's embedded tz database); "STUCK <t> ..." when
//	    robfig's Next returns t, not after the instant it was given (it would loop), followed by
//	    the instants before it.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
)

// At most this many instants of one window, so a mistaken window cannot run away.
const maxWindow = 100000

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var each func(line string) (string, error)
	switch {
	case len(os.Args) == 2 && os.Args[1] == "window":
		each = window
	case len(os.Args) == 3:
		start, err1 := strconv.ParseInt(os.Args[1], 10, 64)
		n, err2 := strconv.Atoi(os.Args[2])
		if err1 != nil || err2 != nil || n < 1 {
			fail("start and n must be whole numbers, n at least 1")
		}
		each = func(line string) (string, error) { return next(line, start, n) }
	default:
		fail("usage: cronref <start-unix-seconds> <n> < schedules | cronref window < lines")
	}
	for in.Scan() {
		answer, err := each(in.Text())
		if err != nil {
			answer = "ERR " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		fmt.Fprintln(out, answer)
	}
	if err := in.Err(); err != nil {
		fail(err.Error())
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, "cronref:", message)
	os.Exit(2)
}

func next(spec string, start int64, n int) (string, error) {
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return "", err
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
	return strings.Join(instants, " "), nil
}

func window(line string) (string, error) {
	fields := strings.SplitN(line, " ", 4)
	if len(fields) != 4 {
		fail("window lines are <zone> <start> <end> <schedule>")
	}
	loc, err := time.LoadLocation(fields[0])
	if err != nil {
		fail(err.Error())
	}
	start, err1 := strconv.ParseInt(fields[1], 10, 64)
	end, err2 := strconv.ParseInt(fields[2], 10, 64)
	if err1 != nil || err2 != nil {
		fail("window start and end must be whole numbers")
	}
	sched, err := cron.ParseStandard(fields[3])
	if err != nil {
		return "", err
	}
	instants := []string{}
	prev := time.Unix(start, 0).In(loc)
	for t := sched.Next(prev); !t.IsZero() && t.Unix() <= end; t = sched.Next(t) {
		if !t.After(prev) {
			// robfig's Next returned a time not after the one it was given: it would loop.
			return "STUCK " + strconv.FormatInt(t.Unix(), 10) + " " + strings.Join(instants, " "), nil
		}
		if len(instants) == maxWindow {
			fail("more than 100000 instants in one window")
		}
		instants = append(instants, strconv.FormatInt(t.Unix(), 10))
		prev = t
	}
	return strings.Join(instants, " "), nil
}
