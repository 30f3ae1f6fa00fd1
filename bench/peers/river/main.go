// Command river-peer measures River (github.com/riverqueue/river) on the workloads of
// duetime's benchmark, for bench/peers/river_peer.py.
//
// One process inserts no-op jobs with ScheduledAt set and works them with a River client
// on the PostgreSQL given by -database-url (migrated with rivermigrate first). Two
// workloads:
//
//   - burst: -jobs jobs, all with ScheduledAt = T (inserted with InsertMany in batches
//     of 5,000), T = start + -lead-s.
//   - sustained: jobs due at -rate per second for -duration-s seconds; job i is due at
//     T0 + i/rate and is inserted -lead-s before it is due (one InsertMany per 10 ms tick).
//
// Every job's Work records (seq, wall-clock start) in memory; at the end the starts are
// written as JSON lines to -records ({"seq":…,"start_unix_ns":…}, one line per start, so
// a job worked twice has two lines) and one JSON summary line goes to stdout. Progress
// lines go to stderr. The run ends when every job has started and completed, or at
// -timeout-s after the last due time (jobs not started by then are lost to the caller).
// SIGINT/SIGTERM stop the client and exit without a summary.
//
// With -sink-url the jobs are the HTTP variant: each records its start, then POSTs
// duetime's HTTP-target request to the URL (body {job_id, execution_id, attempt,
// scheduled_at, payload: {seq}}, headers Idempotency-Key: <River job id>, X-Duetime-Job-Id,
// X-Duetime-Attempt) with one shared keep-alive net/http client; a non-2xx answer or a
// transport error fails the attempt, and River retries it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type options struct {
	databaseURL       string
	scenario          string
	jobs              int
	rate              float64
	durationS         float64
	leadS             float64
	maxWorkers        int
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
	timeoutS          float64
	records           string
	sinkURL           string
}

func parseOptions() (options, error) {
	var o options
	flag.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (required)")
	flag.StringVar(&o.scenario, "scenario", "burst", "burst or sustained")
	flag.IntVar(&o.jobs, "jobs", 10000, "burst: number of jobs due at one instant")
	flag.Float64Var(&o.rate, "rate", 350, "sustained: jobs due per second")
	flag.Float64Var(&o.durationS, "duration-s", 30, "sustained: seconds of due times")
	flag.Float64Var(&o.leadS, "lead-s", 10, "seconds between a job's insert and its due time")
	// River's own benchmark (cmd/river/riverbench) uses 2 ms / 20 ms and MaxWorkers 2,000.
	flag.IntVar(&o.maxWorkers, "max-workers", 2000, "QueueConfig.MaxWorkers of the default queue")
	flag.DurationVar(&o.fetchCooldown, "fetch-cooldown", 2*time.Millisecond, "Config.FetchCooldown")
	flag.DurationVar(&o.fetchPollInterval, "fetch-poll-interval", 20*time.Millisecond, "Config.FetchPollInterval")
	flag.Float64Var(&o.timeoutS, "timeout-s", 120, "give up this long after the last due time")
	flag.StringVar(&o.records, "records", "", "file for the JSON lines of job starts (required)")
	flag.StringVar(&o.sinkURL, "sink-url", "", "the HTTP variant: each job POSTs to this URL")
	flag.Parse()
	switch {
	case o.databaseURL == "":
		return o, errors.New("-database-url is required")
	case o.records == "":
		return o, errors.New("-records is required")
	case o.scenario != "burst" && o.scenario != "sustained":
		return o, fmt.Errorf("-scenario must be burst or sustained, not %q", o.scenario)
	case o.scenario == "burst" && o.jobs < 1:
		return o, errors.New("-jobs must be at least 1")
	case o.scenario == "sustained" && (o.rate <= 0 || o.durationS <= 0):
		return o, errors.New("-rate and -duration-s must be positive")
	case o.leadS < 0 || o.timeoutS <= 0:
		return o, errors.New("-lead-s must be >= 0 and -timeout-s > 0")
	}
	return o, nil
}

// total is the number of jobs the workload inserts.
func (o options) total() int {
	if o.scenario == "burst" {
		return o.jobs
	}
	return int(o.rate * o.durationS)
}

// dueAt is job seq's due time, given the first due time t0.
func (o options) dueAt(t0 time.Time, seq int) time.Time {
	if o.scenario == "burst" {
		return t0
	}
	return t0.Add(time.Duration(float64(seq) / o.rate * float64(time.Second)))
}

type noopArgs struct {
	Seq int `json:"seq"`
}

func (noopArgs) Kind() string { return "duetime_peer_noop" }

type start struct {
	seq int
	ns  int64
}

// recorder keeps every start in memory; the no-op job does nothing else.
type recorder struct {
	mu       sync.Mutex
	starts   []start
	seen     []bool
	distinct atomic.Int64
}

func newRecorder(total int) *recorder {
	return &recorder{starts: make([]start, 0, total), seen: make([]bool, total)}
}

func (r *recorder) record(seq int, ns int64) {
	r.mu.Lock()
	r.starts = append(r.starts, start{seq: seq, ns: ns})
	first := seq >= 0 && seq < len(r.seen) && !r.seen[seq]
	if first {
		r.seen[seq] = true
	}
	r.mu.Unlock()
	if first {
		r.distinct.Add(1)
	}
}

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	rec *recorder
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	w.rec.record(job.Args.Seq, time.Now().UnixNano())
	return nil
}

type httpArgs struct {
	Seq       int    `json:"seq"`
	DueUnixMs int64  `json:"due_unix_ms"`
	URL       string `json:"url"`
}

func (httpArgs) Kind() string { return "duetime_peer_http" }

// httpWorker POSTs duetime's HTTP-target request; the client keeps connections alive.
type httpWorker struct {
	river.WorkerDefaults[httpArgs]
	rec    *recorder
	client *http.Client
}

func (w *httpWorker) Work(ctx context.Context, job *river.Job[httpArgs]) error {
	w.rec.record(job.Args.Seq, time.Now().UnixNano())
	id := strconv.FormatInt(job.ID, 10)
	body, err := json.Marshal(map[string]any{
		"job_id":       id,
		"execution_id": id,
		"attempt":      job.Attempt,
		"scheduled_at": time.UnixMilli(job.Args.DueUnixMs).UTC().Format("2006-01-02T15:04:05.000Z"),
		"payload":      map[string]int{"seq": job.Args.Seq},
	})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, job.Args.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("X-Duetime-Job-Id", id)
	req.Header.Set("X-Duetime-Attempt", strconv.Itoa(job.Attempt))
	req.Header.Set("User-Agent", "river-peer")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body) // drain, so the connection is reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("sink answered %d", resp.StatusCode)
	}
	return nil
}

type summary struct {
	Scenario           string            `json:"scenario"`
	Inserted           int               `json:"inserted"`
	StartedDistinct    int64             `json:"started_distinct"`
	Completed          int64             `json:"completed"`
	FirstDueUnixNs     int64             `json:"first_due_unix_ns"`
	LastCompletedNs    int64             `json:"last_completed_unix_ns"`
	InsertDoneUnixNs   int64             `json:"insert_done_unix_ns"`
	ProducerMaxBehindS float64           `json:"producer_max_behind_s"`
	TimedOut           bool              `json:"timed_out"`
	Versions           map[string]string `json:"versions"`
	Config             map[string]any    `json:"config"`
}

func main() {
	o, err := parseOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "river-peer:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "river-peer:", err)
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "river: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("running River's migrations: %w", err)
	}
	// A clean table per run, as River's own benchmark does.
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return err
	}

	total := o.total()
	rec := newRecorder(total)
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{rec: rec})
	river.AddWorker(workers, &httpWorker{rec: rec, client: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second},
	}})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     o.fetchCooldown,
		FetchPollInterval: o.fetchPollInterval,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.maxWorkers}},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	events, cancelEvents := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: total + 1000, // never drop a completion event: they are counted
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancelEvents()
	var completed, lastCompletedNs atomic.Int64
	go func() {
		for ev := range events {
			if ev.Kind == river.EventKindJobCompleted {
				lastCompletedNs.Store(time.Now().UnixNano())
				completed.Add(1)
			}
		}
	}()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := client.Stop(stopCtx); err != nil {
			progress("stopping the client: %v", err)
		}
	}()

	t0 := time.Now().Add(time.Duration(o.leadS * float64(time.Second)))
	maxBehind, err := insertAll(ctx, client, o, t0, total)
	if err != nil {
		return err
	}
	insertDone := time.Now()
	if o.scenario == "burst" && insertDone.After(t0) {
		progress("warning: inserting took past the due time by %s; raise -lead-s", insertDone.Sub(t0))
	}

	lastDue := o.dueAt(t0, total-1)
	deadline := lastDue.Add(time.Duration(o.timeoutS * float64(time.Second)))
	timedOut, err := waitForAll(ctx, rec, &completed, int64(total), deadline)
	if err != nil {
		return err
	}
	if err := writeRecords(o.records, rec); err != nil {
		return err
	}
	var pgVersion string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	s := summary{
		Scenario:           o.scenario,
		Inserted:           total,
		StartedDistinct:    rec.distinct.Load(),
		Completed:          completed.Load(),
		FirstDueUnixNs:     t0.UnixNano(),
		LastCompletedNs:    lastCompletedNs.Load(),
		InsertDoneUnixNs:   insertDone.UnixNano(),
		ProducerMaxBehindS: maxBehind.Seconds(),
		TimedOut:           timedOut,
		Versions:           versions(pgVersion),
		Config: map[string]any{
			"max_workers":            o.maxWorkers,
			"fetch_cooldown_ms":      float64(o.fetchCooldown) / float64(time.Millisecond),
			"fetch_poll_interval_ms": float64(o.fetchPollInterval) / float64(time.Millisecond),
			"scheduler_interval_s":   5, // River's JobSchedulerIntervalDefault; not configurable
			"pool_max_conns":         pool.Config().MaxConns,
			"insert":                 "InsertMany",
			"lead_s":                 o.leadS,
			"target":                 target(o),
		},
	}
	return json.NewEncoder(os.Stdout).Encode(s)
}

// insertAll inserts the workload and returns how far the inserts fell behind their plan
// (the sustained plan inserts job i at due(i) - lead).
func insertAll(ctx context.Context, client *river.Client[pgx.Tx], o options, t0 time.Time, total int) (time.Duration, error) {
	const batch = 5000
	lead := time.Duration(o.leadS * float64(time.Second))
	var maxBehind time.Duration
	next := 0
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	lastReport := time.Now()
	for next < total {
		now := time.Now()
		end := next
		if o.scenario == "burst" {
			end = min(total, next+batch)
		} else {
			for end < total && end-next < batch && !o.dueAt(t0, end).Add(-lead).After(now) {
				end++
			}
		}
		if end > next {
			if behind := now.Sub(o.dueAt(t0, next).Add(-lead)); behind > maxBehind && o.scenario == "sustained" {
				maxBehind = behind
			}
			params := make([]river.InsertManyParams, 0, end-next)
			for seq := next; seq < end; seq++ {
				due := o.dueAt(t0, seq)
				var args river.JobArgs = noopArgs{Seq: seq}
				if o.sinkURL != "" {
					args = httpArgs{Seq: seq, DueUnixMs: due.UnixMilli(), URL: o.sinkURL}
				}
				params = append(params, river.InsertManyParams{
					Args:       args,
					InsertOpts: &river.InsertOpts{ScheduledAt: due},
				})
			}
			if _, err := client.InsertMany(ctx, params); err != nil {
				return maxBehind, fmt.Errorf("InsertMany: %w", err)
			}
			next = end
		}
		if time.Since(lastReport) >= 2*time.Second {
			progress("inserted %d/%d", next, total)
			lastReport = time.Now()
		}
		if o.scenario == "sustained" && next < total {
			select {
			case <-ctx.Done():
				return maxBehind, ctx.Err()
			case <-ticker.C:
			}
		}
	}
	progress("inserted %d/%d", next, total)
	return maxBehind, nil
}

// waitForAll waits until every job has started and completed; true when the deadline hit.
func waitForAll(ctx context.Context, rec *recorder, completed *atomic.Int64, total int64, deadline time.Time) (bool, error) {
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	lastReport := time.Now()
	for {
		started := rec.distinct.Load()
		done := completed.Load()
		if started >= total && done >= total {
			progress("started %d/%d, completed %d", started, total, done)
			return false, nil
		}
		if time.Now().After(deadline) {
			progress("timed out: started %d/%d, completed %d", started, total, done)
			return true, nil
		}
		if time.Since(lastReport) >= 2*time.Second {
			progress("started %d/%d, completed %d", started, total, done)
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-ticker.C:
		}
	}
}

func target(o options) string {
	if o.sinkURL != "" {
		return "http (net/http POST, shared keep-alive client)"
	}
	return "noop"
}

func writeRecords(path string, rec *recorder) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	buf := make([]byte, 0, 64*len(rec.starts))
	for _, s := range rec.starts {
		buf = fmt.Appendf(buf, "{\"seq\":%d,\"start_unix_ns\":%d}\n", s.seq, s.ns)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func versions(pgVersion string) map[string]string {
	v := map[string]string{"go": runtime.Version(), "postgresql": pgVersion}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			switch dep.Path {
			case "github.com/riverqueue/river":
				v["river"] = dep.Version
			case "github.com/riverqueue/river/riverdriver/riverpgxv5":
				v["riverpgxv5"] = dep.Version
			case "github.com/jackc/pgx/v5":
				v["pgx"] = dep.Version
			}
		}
	}
	return v
}
