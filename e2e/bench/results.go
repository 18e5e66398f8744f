package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
)

// outDir is where the run's results file and charts go.
var outDir = flag.String("out", benchplot.DefaultDir, "directory for the results file ("+resultsFile+") and the charts (PNG)")

const resultsFile = "bench-results.json"

// The results file: every figure of the run, durations in milliseconds,
// CPU in CPU-seconds. A case that did not run is left out.
type (
	report struct {
		Date    string      `json:"date"`
		Commit  string      `json:"commit"`
		Machine machineInfo `json:"machine"`
		Setup   setupInfo   `json:"setup"`

		Reads      []readJSON       `json:"reads,omitempty"`
		Reviews    string           `json:"reviews,omitempty"`
		Heap       *heapJSON        `json:"heapPerPod,omitempty"`
		Storm      *stormJSON       `json:"storm,omitempty"`
		Consistent []consistentJSON `json:"consistentReads,omitempty"`
		Writes     *writesJSON      `json:"writes,omitempty"`
		Staleness  *stalenessJSON   `json:"staleness,omitempty"`
		ColdStart  []coldStartJSON  `json:"coldStart,omitempty"`
		WatchChurn *churnJSON       `json:"watchChurn,omitempty"`
		WatchLat   *latencyJSON     `json:"watchEventLatency,omitempty"`
		WatchMem   *memoryJSON      `json:"watchMemory,omitempty"`
		Idle       *idleJSON        `json:"idle,omitempty"`
		Sizing     *sizingJSON      `json:"sizing,omitempty"`
		NATSync    *natSyncJSON     `json:"natSync,omitempty"`
		Rewrite    *rewriteIdleJSON `json:"rewriteIdle,omitempty"`
	}
	idleJSON struct {
		TookMs   float64            `json:"windowMs"`
		Requests map[string]int     `json:"requestsBeyondWatches"`
		Watches  map[string]int     `json:"watchesOpened"`
		Held     []string           `json:"watchesHeld"`
		Probes   map[string]float64 `json:"readyzProbes,omitempty"`
		Heap     float64            `json:"heapBytes"`
		Resident float64            `json:"residentBytes"`
		Objects  map[string]float64 `json:"cachedObjects"`
	}
	sizingJSON struct {
		Objects         int     `json:"objects"`
		PerService      float64 `json:"serviceBytes"`
		PerServiceWarm  float64 `json:"serviceWarmBytes"`
		PerSlice1       float64 `json:"endpointSliceOf1Bytes"`
		PerSlice1Warm   float64 `json:"endpointSliceOf1WarmBytes"`
		PerEndpoint     float64 `json:"endpointBytes"`
		PerEndpointWarm float64 `json:"endpointWarmBytes"`
	}
	natSyncTableJSON struct {
		Services      int     `json:"services"`
		Rules         int     `json:"rules"`
		Syncs         float64 `json:"syncs"`
		ChildCPUMs    float64 `json:"iptablesCPUPerSyncMs"`
		SyncMs        float64 `json:"wallPerSyncMs"`
		Refreshes     float64 `json:"livenessRefreshes"`
		LateRefreshes float64 `json:"lateLivenessRefreshes"`
		MaxGap        string  `json:"largestRefreshGap"`
	}
	natSyncJSON struct {
		Empty natSyncTableJSON `json:"emptyTable"`
		Full  natSyncTableJSON `json:"fullTable"`
	}
	machineInfo struct {
		CPUs        int    `json:"cpus"`
		MemoryBytes int64  `json:"memoryBytes"`
		Kernel      string `json:"kernel"`
		Go          string `json:"go"`
	}
	setupInfo struct {
		Pods     int    `json:"pods"`
		NodePods int    `json:"nodePods"`
		Services int    `json:"services"`
		Requests int    `json:"requests"`
		Inflight int    `json:"inflight"`
		Accept   string `json:"accept"`
	}
	// pathJSON is one case along one path.
	pathJSON struct {
		P50ms      float64 `json:"p50ms"`
		P99ms      float64 `json:"p99ms"`
		Requests   int     `json:"requests"`
		Errors     int     `json:"errors"`
		ApiserverS float64 `json:"apiserverCPUSeconds"`
		AgentS     float64 `json:"agentCPUSeconds,omitempty"`
		Upstream   int     `json:"upstreamRequests"`
	}
	readJSON struct {
		Case     string   `json:"case"`
		Agent    pathJSON `json:"agent"`
		Direct   pathJSON `json:"direct"`
		P50Ratio float64  `json:"p50Ratio"`
		P99Ratio float64  `json:"p99Ratio"`
		// UpstreamPerK is upstream requests per 1,000 reads through the
		// agent; CPUPerK kube-apiserver CPU-seconds per 1,000 reads.
		UpstreamPerK   float64 `json:"upstreamPer1000Agent"`
		CPUPerKAgent   float64 `json:"apiserverCPUSecondsPer1000Agent"`
		CPUPerKDirect  float64 `json:"apiserverCPUSecondsPer1000Direct"`
		UpstreamDetail string  `json:"upstreamDetail,omitempty"`
	}
	consistentJSON struct {
		readJSON
		Inflight   int     `json:"inflight"`
		ProbesPerK float64 `json:"probesPer1000"`
	}
	heapJSON struct {
		AgentSynced   float64 `json:"agentCacheSyncedBytes"`
		AgentWarm     float64 `json:"agentCacheBothEncodingsBytes"`
		Informer      float64 `json:"typedInformerBytes"`
		AgentProcess  float64 `json:"agentProcessBytes"`
		RatioSynced   float64 `json:"ratioSynced"`
		RatioWarm     float64 `json:"ratioBothEncodings"`
		CachedPods    int     `json:"pods"`
		ProcessPodsOn int     `json:"agentProcessPods"`
	}
	stormPathJSON struct {
		SyncedMs   float64   `json:"allSyncedMs"`
		SyncsMs    []float64 `json:"syncedMs"`
		ApiserverS float64   `json:"apiserverCPUSeconds"`
		IdleS      float64   `json:"apiserverIdleCPUSeconds"`
		Bytes      float64   `json:"apiserverBytesSent"`
		Failed     int       `json:"failed"`
	}
	stormJSON struct {
		Informers int           `json:"informers"`
		Agent     stormPathJSON `json:"agent"`
		Direct    stormPathJSON `json:"direct"`
		CPURatio  float64       `json:"apiserverCPURatio"`
		Target    float64       `json:"apiserverCPURatioTarget"`
	}
	writeVerbJSON struct {
		Verb     string  `json:"verb"`
		AgentP50 float64 `json:"agentP50ms"`
		AgentP99 float64 `json:"agentP99ms"`
		DirP50   float64 `json:"directP50ms"`
		DirP99   float64 `json:"directP99ms"`
		P50Ratio float64 `json:"p50Ratio"`
		P99Ratio float64 `json:"p99Ratio"`
		Errors   [2]int  `json:"errorsAgentDirect"`
	}
	writesJSON struct {
		PerVerb        int             `json:"requestsPerVerbAndPath"`
		Block          int             `json:"block"`
		Inflight       int             `json:"inflight"`
		PayloadBytes   int             `json:"payloadBytes"`
		Verbs          []writeVerbJSON `json:"verbs"`
		P50Target      float64         `json:"p50RatioTarget"`
		CPUPerKAgent   float64         `json:"apiserverCPUSecondsPer1000Agent"`
		CPUPerKDirect  float64         `json:"apiserverCPUSecondsPer1000Direct"`
		AgentCPUPerK   float64         `json:"agentCPUSecondsPer1000"`
		RequestsAgent  int             `json:"requestsAgent"`
		RequestsDirect int             `json:"requestsDirect"`
	}
	// rewriteRequestJSON is one request of the rewrite idle case through
	// the agent without profiles and the one with.
	rewriteRequestJSON struct {
		Request       string    `json:"request"`
		Path          string    `json:"path"`
		Cached        bool      `json:"cached"`
		WithoutP50    float64   `json:"withoutProfilesP50ms"`
		WithoutP99    float64   `json:"withoutProfilesP99ms"`
		WithP50       float64   `json:"withProfilesP50ms"`
		WithP99       float64   `json:"withProfilesP99ms"`
		P50Ratio      float64   `json:"p50Ratio"`
		P99Ratio      float64   `json:"p99Ratio"`
		BlocksWithout []float64 `json:"blockP50msWithoutProfiles"`
		BlocksWith    []float64 `json:"blockP50msWithProfiles"`
		CPUPerKNone   float64   `json:"agentCPUSecondsPer1000WithoutProfiles"`
		CPUPerKWith   float64   `json:"agentCPUSecondsPer1000WithProfiles"`
		Errors        [2]int    `json:"errorsWithoutWith"`
	}
	rewriteIdleJSON struct {
		PerRequest int                  `json:"requestsPerRequestAndAgent"`
		Blocks     int                  `json:"blocksPerAgent"`
		Inflight   int                  `json:"inflight"`
		Selects    string               `json:"profileSelects"`
		Requests   []rewriteRequestJSON `json:"requests"`
		P50Target  float64              `json:"p50RatioTarget"`
	}
	distJSON struct {
		AgentP50  float64 `json:"agentP50ms"`
		AgentP99  float64 `json:"agentP99ms"`
		DirP50    float64 `json:"directP50ms"`
		DirP99    float64 `json:"directP99ms"`
		P50Ratio  float64 `json:"p50Ratio"`
		P99Ratio  float64 `json:"p99Ratio"`
		P50Excess float64 `json:"agentMinusDirectP50ms"`
		P99Excess float64 `json:"agentMinusDirectP99ms"`
	}
	stalenessJSON struct {
		Writes         int        `json:"writes"`
		Missed         int        `json:"missed"`
		ReadRV0        distJSON   `json:"readResourceVersion0"`
		StaleReadsPerW [2]float64 `json:"staleReadsPerWriteAgentDirect"`
		Informer       *distJSON  `json:"informer,omitempty"`
	}
	coldStartJSON struct {
		Variant        string    `json:"variant"`
		ReadyMs        []float64 `json:"readyMs"`
		InterceptingMs []float64 `json:"interceptingMs"`
		ReadyMedianMs  float64   `json:"readyMedianMs"`
		ReadyMaxMs     float64   `json:"readyMaxMs"`
		InterceptMed   float64   `json:"interceptingMedianMs"`
		InterceptMax   float64   `json:"interceptingMaxMs"`
		// TargetMs applies to intercepting.
		TargetMs   float64 `json:"targetMs"`
		CSRsIssued int     `json:"csrsIssued"`
	}
	churnWindowJSON struct {
		TookMs     float64 `json:"windowMs"`
		PodWrites  int     `json:"podWrites"`
		SvcWrites  int     `json:"serviceWrites"`
		SyncedMs   float64 `json:"informersSyncedMs"`
		ApiserverS float64 `json:"apiserverCPUSeconds"`
		Bytes      float64 `json:"apiserverBytesSent"`
		AgentS     float64 `json:"agentCPUSeconds"`
	}
	churnJSON struct {
		Informers int             `json:"informers"`
		Rate      int             `json:"ratePerSecond"`
		None      churnWindowJSON `json:"noInformers"`
		Agent     churnWindowJSON `json:"agent"`
		Direct    churnWindowJSON `json:"direct"`
		Target    float64         `json:"ratioTarget"`
	}
	latencyJSON struct {
		Writes int      `json:"writes"`
		Missed int      `json:"missed"`
		Dist   distJSON `json:"fromWriteStart"`
		// DiffP50 and DiffP99 are of agent minus direct, write by write.
		DiffP50 float64 `json:"writeByWriteAgentMinusDirectP50ms"`
		DiffP99 float64 `json:"writeByWriteAgentMinusDirectP99ms"`
	}
	memoryJSON struct {
		Watchers int     `json:"watchers"`
		None     float64 `json:"heapInuseNoWatcherBytes"`
		One      float64 `json:"heapInuseOneWatcherBytes"`
		All      float64 `json:"heapInuseAllWatchersBytes"`
	}
)

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msAll(s []time.Duration) []float64 {
	out := make([]float64, len(s))
	for i, d := range s {
		out[i] = msOf(d)
	}
	return out
}

// pctOf returns the p-th percentile of sorted s, 0 if s is empty.
func pctOf(s []time.Duration, p int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)*p/100, len(s)-1)]
}

func distOf(agent, direct []time.Duration) distJSON {
	a50, a99, d50, d99 := pctOf(agent, 50), pctOf(agent, 99), pctOf(direct, 50), pctOf(direct, 99)
	return distJSON{
		AgentP50: msOf(a50), AgentP99: msOf(a99), DirP50: msOf(d50), DirP99: msOf(d99),
		P50Ratio: ratio(a50, d50), P99Ratio: ratio(a99, d99),
		P50Excess: msOf(a50 - d50), P99Excess: msOf(a99 - d99),
	}
}

func pathOf(r result) pathJSON {
	return pathJSON{P50ms: msOf(r.p50), P99ms: msOf(r.p99), Requests: r.requests, Errors: r.errors,
		ApiserverS: r.apiserverS, AgentS: r.agentS, Upstream: r.upstream}
}

func readOf(name string, agent, direct result) readJSON {
	return readJSON{
		Case: name, Agent: pathOf(agent), Direct: pathOf(direct),
		P50Ratio: ratio(agent.p50, direct.p50), P99Ratio: ratio(agent.p99, direct.p99),
		UpstreamPerK:   perK(float64(agent.upstream), agent.requests),
		CPUPerKAgent:   perK(agent.apiserverS, agent.requests),
		CPUPerKDirect:  perK(direct.apiserverS, direct.requests),
		UpstreamDetail: agent.upstreamDet,
	}
}

func stormPathOf(r stormResult) stormPathJSON {
	return stormPathJSON{SyncedMs: msOf(r.synced), SyncsMs: msAll(r.syncs), ApiserverS: r.apiserverS,
		IdleS: r.idleS, Bytes: r.bytes, Failed: r.failed}
}

func churnWindowOf(w churnWindow) churnWindowJSON {
	return churnWindowJSON{TookMs: msOf(w.took), PodWrites: w.podWrites, SvcWrites: w.svcWrites, SyncedMs: msOf(w.synced),
		ApiserverS: w.apiserverS, Bytes: w.bytes, AgentS: w.agentS}
}

// newReport starts the results of a run: when, which commit, which
// machine, what cluster.
func newReport(o options) *report {
	r := &report{
		Date:   time.Now().UTC().Format(time.RFC3339),
		Commit: commit(),
		Machine: machineInfo{
			CPUs:        runtime.NumCPU(),
			MemoryBytes: memTotal(),
			Go:          runtime.Version(),
		},
		Setup: setupInfo{Pods: o.pods, NodePods: o.nodePods, Services: o.services, Requests: o.requests, Inflight: o.inflight, Accept: o.accept},
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		r.Machine.Kernel = strings.TrimSpace(string(b))
	}
	return r
}

// commit is the work tree's commit (with "-dirty" if it has changes), or
// the build's if git cannot tell.
func commit() string {
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		c := strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
			c += "-dirty"
		}
		return c
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// memTotal is the machine's memory in bytes (MemTotal), 0 if unknown.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// charts holds the latency samples the run's charts are drawn from.
type charts struct {
	// cdfs are latency CDFs, agent against direct, by chart title.
	cdfs map[string]map[string][]time.Duration
	// storm is when each informer process synced, by path.
	storm map[string][]time.Duration
}

func (c *charts) cdf(title string, sets map[string][]time.Duration) {
	if c.cdfs == nil {
		c.cdfs = map[string]map[string][]time.Duration{}
	}
	c.cdfs[title] = sets
}

// write writes the results file and the charts to dir and prints where.
func (c *charts) write(dir benchplot.Dir, r *report) error {
	path, err := dir.WriteJSON(resultsFile, r)
	if err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	written := []string{path}
	for title, sets := range c.cdfs {
		p, err := dir.CDF("cdf-"+benchplot.FileName(title), title, sets)
		if err != nil {
			return fmt.Errorf("chart %q: %w", title, err)
		}
		written = append(written, p)
	}
	if c.storm != nil {
		p, err := dir.Cumulative("storm-timeline", "informer start-up storm: processes synced since the start", "informer processes synced", c.storm)
		if err != nil {
			return fmt.Errorf("storm chart: %w", err)
		}
		written = append(written, p)
	}
	fmt.Printf("\nresults and charts: %s\n", strings.Join(written, ", "))
	return nil
}

// report adds the watch cases that ran to the results.
func (w *watchResults) report(r *report) {
	if c := w.churn; c != nil {
		r.WatchChurn = &churnJSON{Informers: c.n, Rate: c.rate, None: churnWindowOf(c.none), Agent: churnWindowOf(c.agent),
			Direct: churnWindowOf(c.direct), Target: churnTarget}
	}
	if l := w.latency; l != nil {
		r.WatchLat = &latencyJSON{Writes: len(l.agent) + l.missed, Missed: l.missed, Dist: distOf(l.agent, l.direct),
			DiffP50: msOf(pctOf(l.diffs, 50)), DiffP99: msOf(pctOf(l.diffs, 99))}
	}
	if mem := w.memory; mem != nil {
		r.WatchMem = &memoryJSON{Watchers: mem.n, None: mem.none, One: mem.one, All: mem.all}
	}
}

// report adds the writes case, if it ran, to the results and its CDFs,
// one per verb, to the charts.
func (w *writesResult) report(r *report, c *charts) {
	if w == nil {
		return
	}
	j := &writesJSON{PerVerb: w.perVerb, Block: w.block, Inflight: w.inflight, PayloadBytes: writePayload, P50Target: writeP50Target,
		CPUPerKAgent: perK(w.agent.apiserverS, w.agent.requests), CPUPerKDirect: perK(w.direct.apiserverS, w.direct.requests),
		AgentCPUPerK: perK(w.agent.agentS, w.agent.requests), RequestsAgent: w.agent.requests, RequestsDirect: w.direct.requests}
	for _, verb := range writeVerbs {
		d := distOf(w.agent.latencies[verb], w.direct.latencies[verb])
		j.Verbs = append(j.Verbs, writeVerbJSON{Verb: verb, AgentP50: d.AgentP50, AgentP99: d.AgentP99, DirP50: d.DirP50, DirP99: d.DirP99,
			P50Ratio: d.P50Ratio, P99Ratio: d.P99Ratio, Errors: [2]int{w.agent.errors[verb], w.direct.errors[verb]}})
		c.cdf(writesCase+", "+verb, map[string][]time.Duration{"agent": w.agent.latencies[verb], "direct": w.direct.latencies[verb]})
	}
	r.Writes = j
}

// report adds the rewrite idle case, if it ran, to the results and its
// CDFs, one per request, to the charts.
func (w *rewriteIdleResult) report(r *report, c *charts) {
	if w == nil {
		return
	}
	j := &rewriteIdleJSON{PerRequest: w.perRequest, Blocks: w.blocks, Inflight: w.inflight, Selects: rewriteProfileSelects, P50Target: rewriteP50Target}
	for _, rq := range w.requests {
		none, with := w.without.latencies[rq.name], w.with.latencies[rq.name]
		// The agent with profiles in distOf's agent place, the one
		// without in its direct place.
		d := distOf(with, none)
		j.Requests = append(j.Requests, rewriteRequestJSON{Request: rq.name, Path: rq.path, Cached: rq.cached,
			WithoutP50: d.DirP50, WithoutP99: d.DirP99, WithP50: d.AgentP50, WithP99: d.AgentP99, P50Ratio: d.P50Ratio, P99Ratio: d.P99Ratio,
			BlocksWithout: msAll(w.without.blockP50s[rq.name]), BlocksWith: msAll(w.with.blockP50s[rq.name]),
			CPUPerKNone: perK(w.without.agentS[rq.name], w.without.requests[rq.name]),
			CPUPerKWith: perK(w.with.agentS[rq.name], w.with.requests[rq.name]),
			Errors:      [2]int{w.without.errors[rq.name], w.with.errors[rq.name]}})
		c.cdf(rewriteIdleCase+", "+rq.name, map[string][]time.Duration{"without profiles": none, "with profiles": with})
	}
	r.Rewrite = j
}

// report adds the staleness case, if it ran, to the results and its CDF
// to the charts.
func (s *stalenessResult) report(r *report, c *charts) {
	if s == nil {
		return
	}
	j := &stalenessJSON{Writes: len(s.agent) + s.missed, Missed: s.missed, ReadRV0: distOf(s.agent, s.direct),
		StaleReadsPerW: [2]float64{float64(s.staleAgent) / float64(len(s.agent)), float64(s.staleDirect) / float64(len(s.direct))}}
	sets := map[string][]time.Duration{"read RV=0, agent": s.agent, "read RV=0, direct": s.direct}
	if w := s.watch; w != nil {
		d := distOf(w.agentAck, w.directAck)
		j.Informer = &d
		sets["informer, agent"], sets["informer, direct"] = w.agentAck, w.directAck
	}
	r.Staleness = j
	c.cdf(stalenessCase+" after a direct write", sets)
}

// report adds the idle case, if it ran, to the results.
func (r *idleResult) report(rep *report) {
	if r == nil {
		return
	}
	rep.Idle = &idleJSON{TookMs: msOf(r.took), Requests: r.requests, Watches: r.watches, Held: r.held, Probes: r.probes,
		Heap: r.heap, Resident: r.resident, Objects: r.objects}
}

// report adds the sizing case, if it ran, to the results.
func (r *sizingResult) report(rep *report) {
	if r == nil {
		return
	}
	rep.Sizing = &sizingJSON{Objects: r.n, PerService: r.perService, PerServiceWarm: r.perServiceWarm, PerSlice1: r.perSlice1,
		PerSlice1Warm: r.perSlice1Warm, PerEndpoint: r.perEndpoint, PerEndpointWarm: r.perEndpointWarm}
}

func natSyncOf(r natSyncResult) natSyncTableJSON {
	return natSyncTableJSON{Services: r.services, Rules: r.rules, Syncs: r.syncs, ChildCPUMs: msOf(r.childCPU), SyncMs: msOf(r.syncTime),
		Refreshes: r.refreshes, LateRefreshes: r.lateRefreshes, MaxGap: r.maxGap}
}
