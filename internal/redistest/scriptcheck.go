package redistest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ScriptCheck is a go-redis hook that watches the scripts a client sends
// (EVAL, EVALSHA, FCALL and their _RO forms, alone or in a pipeline) and
// records every call whose keys span more than one hash slot: a Redis
// Cluster refuses such a call (CROSSSLOT) where a single node runs it, so
// the single-node suites would never notice. Client installs one on every
// client it hands out and fails the test in its cleanup if it recorded a
// call; add one to a client of your own with AddHook.
//
// It is safe for concurrent use.
type ScriptCheck struct {
	mu    sync.Mutex
	calls map[string]int // by SHA1
	bad   []ScriptCall
}

// ScriptCall is one script call: the script and the keys it was passed.
type ScriptCall struct {
	// SHA1 is the script's SHA1 (for an FCALL, the function's name).
	SHA1 string
	// Keys is what the call passed as KEYS.
	Keys []string
}

// Script names the script: see ScriptName.
func (c ScriptCall) Script() string { return ScriptName(c.SHA1) }

// String describes the call with each key's slot.
func (c ScriptCall) String() string {
	keys := make([]string, len(c.Keys))
	for i, k := range c.Keys {
		keys[i] = fmt.Sprintf("%s (slot %d)", k, Slot(k))
	}
	return c.Script() + " with KEYS " + strings.Join(keys, ", ")
}

// NewScriptCheck returns a ScriptCheck that has seen nothing.
func NewScriptCheck() *ScriptCheck {
	return &ScriptCheck{calls: map[string]int{}}
}

// DialHook passes dials through.
func (sc *ScriptCheck) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook checks each script call before it is sent.
func (sc *ScriptCheck) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sc.see(cmd.Args())
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook checks each script call of a pipeline before it is
// sent.
func (sc *ScriptCheck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			sc.see(cmd.Args())
		}
		return next(ctx, cmds)
	}
}

func (sc *ScriptCheck) see(args []any) {
	call, ok := parseScriptCall(args)
	if !ok {
		return
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.calls[call.SHA1]++
	for _, k := range call.Keys[min(1, len(call.Keys)):] {
		if Slot(k) != Slot(call.Keys[0]) {
			sc.bad = append(sc.bad, call)
			return
		}
	}
}

// Calls returns how many calls of each script it saw, by ScriptName.
func (sc *ScriptCheck) Calls() map[string]int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := map[string]int{}
	for sha, n := range sc.calls {
		out[ScriptName(sha)] += n
	}
	return out
}

// CrossSlot returns the calls it saw whose keys span several slots.
func (sc *ScriptCheck) CrossSlot() []ScriptCall {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return slices.Clone(sc.bad)
}

// Err returns nil, or an error naming each script it saw called with keys
// of several slots and those keys.
func (sc *ScriptCheck) Err() error {
	bad := sc.CrossSlot()
	if len(bad) == 0 {
		return nil
	}
	seen := map[string]bool{}
	var lines []string
	for _, c := range bad {
		if s := c.String(); !seen[s] {
			seen[s] = true
			lines = append(lines, s)
		}
	}
	const show = 10
	more := ""
	if len(lines) > show {
		more = fmt.Sprintf("\n\t... and %d more", len(lines)-show)
		lines = lines[:show]
	}
	return fmt.Errorf("redistest: %d script call(s) passed keys of several hash slots, which a Redis Cluster refuses"+
		" (CROSSSLOT); give every key of a call the same hash tag:\n\t%s%s", len(bad), strings.Join(lines, "\n\t"), more)
}

// parseScriptCall returns the script call that args send, if they send
// one. It records the source of an EVAL or a SCRIPT LOAD, so that
// ScriptName can name the script of a later EVALSHA.
func parseScriptCall(args []any) (ScriptCall, bool) {
	if len(args) < 2 {
		return ScriptCall{}, false
	}
	arg := func(i int) string { return fmt.Sprint(args[i]) }
	var call ScriptCall
	switch strings.ToLower(arg(0)) {
	case "eval", "eval_ro":
		call.SHA1 = learnSource(arg(1))
	case "evalsha", "evalsha_ro":
		call.SHA1 = strings.ToLower(arg(1))
	case "fcall", "fcall_ro":
		call.SHA1 = "function " + arg(1)
	case "script":
		if len(args) == 3 && strings.EqualFold(arg(1), "load") {
			learnSource(arg(2))
		}
		return ScriptCall{}, false
	default:
		return ScriptCall{}, false
	}
	if len(args) < 3 {
		return ScriptCall{}, false
	}
	n, err := strconv.Atoi(arg(2))
	if err != nil || n < 0 || 3+n > len(args) {
		return ScriptCall{}, false // the server refuses it
	}
	for i := 3; i < 3+n; i++ {
		call.Keys = append(call.Keys, arg(i))
	}
	return call, true
}

// sources names every script whose source this process sent (EVAL,
// SCRIPT LOAD), by SHA1.
var sources sync.Map

// luaHeader matches a script file's header line, "-- name.lua: ...".
var luaHeader = regexp.MustCompile(`(?m)^--\s*([\w.-]+\.lua):`)

// learnSource records src's name (sourceName) and returns its SHA1.
func learnSource(src string) string {
	return learnSourceAs(src, "")
}

// learnSourceAs records src's name and returns its SHA1: name, the
// module's file names, replaces any name; without one, src gets
// sourceName's unless it has a name.
func learnSourceAs(src, name string) string {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	if name != "" {
		sources.Store(sha, name)
	} else if _, ok := sources.Load(sha); !ok {
		sources.Store(sha, sourceName(src))
	}
	return sha
}

// sourceName names a script by the .lua files its header lines name, in
// order and joined by '+' (mapcore prepends batch.lua to the scripts that
// settle: "batch.lua+settle.lua"), or, without one, by its first line.
func sourceName(src string) string {
	var files []string
	for _, m := range luaHeader.FindAllStringSubmatch(src, -1) {
		if !slices.Contains(files, m[1]) {
			files = append(files, m[1])
		}
	}
	if len(files) > 0 {
		return strings.Join(files, "+")
	}
	first, _, _ := strings.Cut(strings.TrimSpace(src), "\n")
	if len(first) > 60 {
		first = first[:60] + "..."
	}
	return "script starting " + strconv.Quote(first)
}

// ScriptName names the script of SHA1 sha: by the .lua files its header
// lines name ("settle.lua", "batch.lua+settle.lua"), else by its first
// line. It knows the sources this process sent (an EVAL, a SCRIPT LOAD:
// go-redis' Script.Load, or Script.Run's fallback on NOSCRIPT) and, from
// the source tree the tests run in, every .lua file of the module alone and
// prefixed by another (a server that cached a script from an earlier
// process only ever sees its EVALSHA). Else the name is the SHA1 itself.
func ScriptName(sha string) string {
	learnModuleScripts.Do(learnModuleLua)
	if name, ok := sources.Load(sha); ok {
		return name.(string)
	}
	return "script " + sha
}

var learnModuleScripts sync.Once

// learnModuleLua learns every .lua file of the module around the working
// directory (a test runs in its package's directory), alone and with each
// other file before it.
func learnModuleLua() {
	files, err := ModuleLua()
	if err != nil {
		return // names fall back to SHA1s
	}
	for _, a := range files {
		learnSourceAs(a.Source, path.Base(a.Path))
		for _, b := range files {
			if a.Path != b.Path {
				learnSourceAs(b.Source+a.Source, path.Base(b.Path)+"+"+path.Base(a.Path))
			}
		}
	}
}

// LuaFile is a .lua file of the module.
type LuaFile struct {
	// Path is the file's path from the module's root, with '/'.
	Path string
	// Source is the file's content.
	Source string
}

// ModuleLua returns every .lua file of the module the working directory
// is in (found by walking up to go.mod), sorted by path.
func ModuleLua() ([]LuaFile, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil, errors.New("redistest: no go.mod above the working directory")
		}
		dir = parent
	}
	var out []LuaFile
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".lua") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		out = append(out, LuaFile{Path: filepath.ToSlash(rel), Source: string(b)})
		return nil
	})
	return out, err
}
