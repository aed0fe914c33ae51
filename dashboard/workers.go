package dashboard

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The workers view (GET /api/workers) is asynq's own server registry
// (Inspector.Servers: each process's queues, concurrency, status and the
// tasks it is running) joined with the record each goreactor worker
// publishes under its asynq server id (keys.Worker: its goreactor version),
// with every active task read in goreactor's terms: the run, element,
// rollback or control request it carries, and the run's current step.
//
// Other applications may share the Redis and its asynq registry. Their
// servers are listed too, marked goreactor=false, since a process polling a
// goreactor queue matters to whoever looks at goreactor's workers; their
// tasks show as kind "foreign" with the type and queue only, never the
// payload, which is theirs and may hold anything.

// maxTaskRuns bounds the runs one answer reads for its tasks' steps: a
// deployment with more active tasks shows the rest without their step.
const maxTaskRuns = 1000

type workersView struct {
	Workers []workerView `json:"workers"`
	// Queue is the ?queue= filter, "" for none.
	Queue string `json:"queue"`
	// Version is this dashboard's goreactor version.
	Version string `json:"version"`
}

type workerView struct {
	ServerID       string          `json:"server_id"`
	Host           string          `json:"host"`
	PID            int             `json:"pid"`
	Queues         []queuePriority `json:"queues"`
	StrictPriority bool            `json:"strict_priority"`
	Concurrency    int             `json:"concurrency"`
	Busy           int             `json:"busy"`
	Status         string          `json:"status"`
	Started        string          `json:"started"`
	// Goreactor is true for a goreactor worker: one that published a
	// record, runs a goreactor task or polls a queue of Config.Queues.
	Goreactor bool `json:"goreactor"`
	// Version is the worker's goreactor version from its record;
	// "unknown (before <this version>)" for a goreactor worker without
	// one, "" for another application's server.
	Version string `json:"version"`
	// Prefix is the record's key prefix ("" without a record).
	Prefix string       `json:"prefix"`
	Tasks  []activeTask `json:"tasks"`
}

type queuePriority struct {
	Queue    string `json:"queue"`
	Priority int    `json:"priority"`
}

// activeTask is a task a server is running, in goreactor's terms.
type activeTask struct {
	TaskID string `json:"task_id"`
	Type   string `json:"type"`
	Queue  string `json:"queue"`
	// Kind is "run", "element", "rollback" or "control"; "foreign" for a
	// task of another application, "malformed" for a goreactor task whose
	// payload does not decode.
	Kind string `json:"kind"`
	// RunID is the run the task works on: the run (run, control), the
	// element run "<map id>.<index>" (element, rollback).
	RunID string `json:"run_id"`
	// Reactor, Status and Step are the run's, as stored now (Step: the
	// step it is executing, "" between steps or once finished).
	Reactor string `json:"reactor"`
	Status  string `json:"status"`
	Step    string `json:"step"`
	// Owner and MapStep are an element's owner run and its map's step.
	Owner   string `json:"owner"`
	MapStep string `json:"map_step"`
	MapID   string `json:"map_id"`
	Index   *int   `json:"index"`
	// Generation is a rollback task's rollback generation.
	Generation int `json:"generation"`
	// Action is a control task's action (undo, cancel, retry ...).
	Action   string `json:"action"`
	Started  string `json:"started"`
	Deadline string `json:"deadline"`
}

// unknownVersion is the version shown for a goreactor worker that
// published no record: one of a goreactor from before the records.
func unknownVersion() string { return "unknown (before " + version.String() + ")" }

// workers serves GET /api/workers[?queue=q].
func (h *Handler) workers(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	queue := r.URL.Query().Get("queue")
	if len(queue) > 256 {
		writeError(w, http.StatusBadRequest, "queue is longer than 256 bytes")
		return
	}
	servers, err := listServers(ctx, h.inspector)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if queue != "" {
		servers = slices.DeleteFunc(servers, func(s *asynq.ServerInfo) bool { return s.Queues[queue] <= 0 })
	}
	records := make([]*redis.MapStringStringCmd, len(servers))
	if len(servers) > 0 {
		// Every record shares the {workers} tag: one pipeline, one node.
		if _, err := h.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, s := range servers {
				records[i] = p.HGetAll(ctx, h.keys.Worker(s.ID))
			}
			return nil
		}); err != nil {
			h.serverError(w, r, fmt.Errorf("read the workers' records: %w", err))
			return
		}
	}
	out := workersView{Workers: make([]workerView, 0, len(servers)), Queue: queue, Version: version.String()}
	for i, s := range servers {
		v := workerView{ServerID: s.ID, Host: s.Host, PID: s.PID, Queues: []queuePriority{}, StrictPriority: s.StrictPriority,
			Concurrency: s.Concurrency, Busy: len(s.ActiveWorkers), Status: s.Status, Started: stamp(s.Started),
			Tasks: make([]activeTask, 0, len(s.ActiveWorkers))}
		for q, p := range s.Queues {
			v.Queues = append(v.Queues, queuePriority{Queue: q, Priority: p})
			if slices.Contains(h.cfg.Queues, q) || q == h.cfg.ControlQueue {
				v.Goreactor = true
			}
		}
		slices.SortFunc(v.Queues, func(a, b queuePriority) int {
			return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Queue, b.Queue))
		})
		if rec, ok := payload.ParseWorkerRecord(records[i].Val()); ok {
			v.Goreactor, v.Version, v.Prefix = true, rec.Version, rec.Prefix
		}
		for _, aw := range s.ActiveWorkers {
			t := describeTask(aw)
			if t.Kind != "foreign" {
				v.Goreactor = true
			}
			v.Tasks = append(v.Tasks, t)
		}
		slices.SortFunc(v.Tasks, func(a, b activeTask) int {
			return cmp.Or(cmp.Compare(a.Started, b.Started), cmp.Compare(a.TaskID, b.TaskID))
		})
		if v.Goreactor && v.Version == "" {
			v.Version = unknownVersion()
		}
		out.Workers = append(out.Workers, v)
	}
	if err := h.addRunState(ctx, out.Workers); err != nil {
		h.serverError(w, r, err)
		return
	}
	slices.SortFunc(out.Workers, func(a, b workerView) int {
		if a.Goreactor != b.Goreactor {
			if a.Goreactor {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.Host, b.Host), cmp.Compare(a.PID, b.PID), cmp.Compare(a.Started, b.Started),
			cmp.Compare(a.ServerID, b.ServerID))
	})
	writeJSON(w, http.StatusOK, out)
}

// describeTask reads an active task in goreactor's terms, from its type
// and payload.
func describeTask(aw *asynq.WorkerInfo) activeTask {
	t := activeTask{TaskID: aw.TaskID, Type: aw.TaskType, Queue: aw.Queue, Kind: "foreign",
		Started: stamp(aw.Started), Deadline: stamp(aw.Deadline)}
	element := func(mapID string, i int) {
		t.MapID, t.Index, t.RunID = mapID, &i, mapstep.ElementID(mapID, i)
	}
	var err error
	switch aw.TaskType {
	case worker.TypeRun:
		var p payload.RunPayload
		p, err = payload.DecodeRun(aw.TaskPayload)
		t.Kind, t.RunID, t.Reactor = "run", p.RunID, p.Reactor
	case worker.TypeElement:
		var p payload.ElementPayload
		if p, err = payload.DecodeElement(aw.TaskPayload); err == nil {
			element(p.MapID, p.Index)
		}
		t.Kind = "element"
	case worker.TypeRollback:
		var p payload.RollbackPayload
		if p, err = payload.DecodeRollback(aw.TaskPayload); err == nil {
			element(p.MapID, p.Index)
			t.Generation = p.Gen
		}
		t.Kind = "rollback"
	case worker.TypeControl:
		var p payload.ControlHead
		p, err = payload.DecodeControlHead(aw.TaskPayload)
		t.Kind, t.RunID, t.Action = "control", p.RunID, p.Action
	}
	if err != nil {
		// The worker archives it; say so rather than show half a task.
		t = activeTask{TaskID: t.TaskID, Type: t.Type, Queue: t.Queue, Kind: "malformed", Started: t.Started, Deadline: t.Deadline}
	}
	return t
}

// addRunState fills in each task's run as stored now (one batched read of
// the runs, one of the element runs): its reactor, status and current
// step, and an element's owner and map step. It reads at most maxTaskRuns.
func (h *Handler) addRunState(ctx context.Context, workers []workerView) error {
	var roots, elems []string
	for _, w := range workers {
		for _, t := range w.Tasks {
			switch {
			case t.RunID == "" || len(roots)+len(elems) >= maxTaskRuns:
			case t.Index != nil:
				elems = append(elems, t.RunID)
			default:
				roots = append(roots, t.RunID)
			}
		}
	}
	byID := map[string]*reactor.Run{}
	for _, batch := range []struct {
		ids  []string
		read func(*reactor.Engine, context.Context, []string) ([]*reactor.Run, error)
	}{{roots, engine.Runs}, {elems, engine.ElementRuns}} {
		if len(batch.ids) == 0 {
			continue
		}
		ids := slices.Compact(slices.Sorted(slices.Values(batch.ids)))
		runs, err := batch.read(h.engine, ctx, ids)
		if err != nil {
			return fmt.Errorf("read the active tasks' runs: %w", err)
		}
		for i, run := range runs {
			if run != nil {
				byID[ids[i]] = run
			}
		}
	}
	for i := range workers {
		for j := range workers[i].Tasks {
			t := &workers[i].Tasks[j]
			run := byID[t.RunID]
			if run == nil {
				continue
			}
			t.Reactor, t.Status = run.Reactor, string(run.Status)
			if run.Current != nil {
				t.Step = run.Current.Step
			}
			if el := run.Element; el != nil {
				t.Owner, t.MapStep = el.Owner, el.Step
			}
		}
	}
	return nil
}

// listServers is Inspector.Servers, which takes no context: when ctx ends
// first, listServers returns ctx's error and the read finishes in the
// background.
func listServers(ctx context.Context, insp *asynq.Inspector) ([]*asynq.ServerInfo, error) {
	type answer struct {
		servers []*asynq.ServerInfo
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		s, err := insp.Servers()
		done <- answer{s, err}
	}()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case a := <-done:
		if a.err != nil {
			return nil, fmt.Errorf("list asynq's servers: %w", a.err)
		}
		return a.servers, nil
	}
}
