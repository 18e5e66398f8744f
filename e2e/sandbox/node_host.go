package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What the real node changes outside its network namespace, and how each
// change is undone. The kubelet and containerd were written to own a
// machine; the sandbox lends them one for a test and takes every change
// back:
//
//   - host-wide sysctls the kubelet sets at start (setupKernelTunables):
//     recorded before it starts, restored after it stops;
//   - cgroups: every pod cgroup lives under a cgroup root of the sandbox's
//     own (/kac-<id>-node, named like its network namespaces) in every
//     hierarchy; its processes are killed and the tree removed;
//   - mounts: the kubelet bind-mounts its root dir onto itself and mounts
//     pod volumes; containerd mounts container root filesystems, /dev/shm
//     and pod network namespaces; all of them lie under the node's Dir and
//     are unmounted;
//   - processes that outlive containerd (its shims): killed;
//   - host paths the kubelet and containerd hard-code (the device-plugin
//     socket dir under /var/lib/kubelet, /var/log/containers, the CNI
//     result cache under /var/lib/cni, shim sockets under /run/containerd):
//     removed when they did not exist before, else only the node's entries
//     in them.
//
// The record of the original state is a journal file written before
// anything is changed, so that a run killed with SIGKILL is undone by the
// next sandbox start, as stale network namespaces are.

// journalDir holds one journal per real node, named after its cluster id.
const journalDir = "/run/kube-apicache-sandbox"

// hostSysctls are the host-wide sysctls the kubelet may set (the kubelet's
// setupKernelTunables) or kube-proxy may raise (conntrack table size, left
// alone by the configuration the sandbox writes, but checked all the same).
var hostSysctls = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max",
}

// hostPaths are the paths outside the node's Dir that the kubelet or
// containerd create even when told to keep their state elsewhere.
var hostPaths = []string{
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
	"/var/lib/cni",
	"/run/containerd",
	"/var/lib/containerd",
	"/opt/containerd",
	"/etc/cni",
	"/opt/cni",
	"/usr/libexec/kubernetes",
}

// journal records the host's state before a real node changed it.
type journal struct {
	// ID is the cluster id (the creating process's PID, and a sequence
	// number after the first cluster of a process); Pid the process.
	ID  string `json:"id"`
	Pid int    `json:"pid"`
	// Dir holds everything the node writes; Socket is containerd's.
	Dir    string `json:"dir"`
	Socket string `json:"socket"`
	// CgroupRoot is the node's cgroup root, as a path below each
	// hierarchy's mount point.
	CgroupRoot string `json:"cgroupRoot"`
	// CNINetwork names the pod network, and so the CNI cache's files.
	CNINetwork string `json:"cniNetwork"`
	// Sysctls are the original values of hostSysctls (those that exist).
	Sysctls map[string]string `json:"sysctls"`
	// Absent are the hostPaths that did not exist before.
	Absent []string `json:"absent"`
}

func journalPath(id string) string { return filepath.Join(journalDir, "realnode-"+id+".json") }

// recordHost captures the host's state into a journal and writes it.
func recordHost(j *journal) error {
	j.Sysctls = ReadHostSysctls()
	j.Absent = nil
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			j.Absent = append(j.Absent, p)
		}
	}
	if err := os.MkdirAll(journalDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	tmp := journalPath(j.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, journalPath(j.ID))
}

// ReadHostSysctls returns the host-wide sysctls a real node may change, as
// seen from the machine's root network namespace (the caller's).
func ReadHostSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range hostSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			m[k] = strings.TrimSpace(string(b))
		}
	}
	return m
}

// undoHost reverts everything j's node changed on the host: it kills the
// node's leftover processes, unmounts everything under its Dir, removes its
// cgroups, restores sysctls, removes the host paths it created and finally
// the journal. It goes on after a failed step and reports every failure;
// the journal stays when something could not be undone, so the next start
// tries again.
func undoHost(j *journal) error {
	var errs []error
	// Processes: the containers (by cgroup), then whatever still names the
	// node's Dir on its command line: shims, and a killed run's daemons.
	if err := killCgroupTree(j.CgroupRoot); err != nil {
		errs = append(errs, err)
	}
	if err := killReferencing(j.Dir); err != nil {
		errs = append(errs, err)
	}
	// containerd 1.6 puts its shims' sockets in /run/containerd/s whatever
	// its state dir; a killed shim leaves its socket there. Each task's
	// bundle names its shim's address.
	addrs, _ := filepath.Glob(filepath.Join(j.Dir, "containerd/state/io.containerd.runtime.v2.task/*/*/address"))
	for _, a := range addrs {
		b, err := os.ReadFile(a)
		if err != nil {
			continue
		}
		sock := strings.TrimPrefix(strings.TrimSpace(string(b)), "unix://")
		if strings.HasPrefix(sock, "/run/containerd/s/") {
			if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := unmountUnder(j.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroupTree(j.CgroupRoot); err != nil {
		errs = append(errs, err)
	}
	for k, v := range j.Sysctls {
		cur, err := os.ReadFile("/proc/sys/" + k)
		if err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s=%s: %w", k, v, err))
		}
	}
	for _, p := range j.Absent {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	if !slices.Contains(j.Absent, "/var/log/containers") {
		// The kubelet's per-container log links point into the node's Dir.
		links, _ := filepath.Glob("/var/log/containers/*.log")
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, j.Dir+"/") {
				_ = os.Remove(l)
			}
		}
	}
	if !slices.Contains(j.Absent, "/var/lib/cni") && j.CNINetwork != "" {
		// The CNI result cache is shared: remove only this network's entries.
		matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", j.CNINetwork+"-*"))
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(journalPath(j.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		_ = os.Remove(journalDir) // only once it is empty
	}
	return errors.Join(errs...)
}

// cleanStaleRealNodes undoes the host changes of real nodes whose process
// is gone (killed before its Stop ran), and removes their state. With
// exclusive (the caller is to start a real node), it fails if a real node
// of another live process exists: the kubelet's sysctls and host paths are
// the machine's, so only one real node runs at a time. Without, such a
// node is left alone: a sandbox without a real node can run beside it.
func cleanStaleRealNodes(exclusive bool) error {
	entries, err := os.ReadDir(journalDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "realnode-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(journalDir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var j journal
		if err := json.Unmarshal(b, &j); err != nil {
			errs = append(errs, fmt.Errorf("reading %s: %w", e.Name(), err))
			continue
		}
		if j.Pid == os.Getpid() {
			continue // this process's own node; its Stop undoes it
		}
		if syscall.Kill(j.Pid, 0) == nil {
			if exclusive {
				errs = append(errs, fmt.Errorf("a real node of process %d is running (dir %s); one real node per machine", j.Pid, j.Dir))
			}
			continue
		}
		if err := undoHost(&j); err != nil {
			errs = append(errs, fmt.Errorf("undoing stale real node %s: %w", j.ID, err))
			continue
		}
		if err := os.RemoveAll(j.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	// Cgroup roots without a journal (killed between creating them and
	// writing it cannot happen, as the journal comes first; this is for
	// hand-made messes): kac-<pid>-* roots of dead processes.
	for _, h := range cgroupHierarchies() {
		dirs, _ := filepath.Glob(filepath.Join(h, nsPrefix+"*"))
		for _, d := range dirs {
			pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), nsPrefix), "-", 2)[0])
			if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
				continue
			}
			root := "/" + filepath.Base(d)
			if err := killCgroupTree(root); err != nil {
				errs = append(errs, err)
			}
			if err := removeCgroupTree(root); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies returns the mount points of the machine's cgroup
// hierarchies (v1 controllers, named hierarchies and a v2 one).
func cgroupHierarchies() []string {
	var out []string
	for _, m := range readMounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// createCgroupRoot creates root in every hierarchy. A new cpuset cgroup
// starts with no CPUs and memory nodes, so it gets its parent's.
func createCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
				return fmt.Errorf("writing %s/%s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// cgroupDirs returns every cgroup directory below root in every
// hierarchy, deepest first.
func cgroupDirs(root string) []string {
	var dirs []string
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, k int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[k], "/") })
	return dirs
}

// cgroupPids returns the processes in any cgroup below root.
func cgroupPids(root string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range cgroupDirs(root) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killCgroupTree kills every process below root until none is left.
func killCgroupTree(root string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := cgroupPids(root)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in cgroup %s", pids, root)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeCgroupTree removes the cgroups below and including root, deepest
// first; a cgroup is removable once its last process has exited.
func removeCgroupTree(root string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var failed []string
		for _, d := range cgroupDirs(root) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				failed = append(failed, fmt.Sprintf("%s: %v", d, err))
			}
		}
		if len(failed) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("removing cgroups: %s", strings.Join(failed, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeExecutables are the programs a real node runs on the host, outside
// its containers: only they are matched by command line.
var nodeExecutables = []string{"containerd", "containerd-shim-runc-v2", "runc", "kubelet", "kube-proxy", "nsenter", "ctr"}

// killReferencing kills every node program (nodeExecutables) whose command
// line mentions dir: containerd's shims name its socket, a daemon its
// config.
func killReferencing(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := pidsReferencing(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v referencing %s survive SIGKILL", pids, dir)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pidsReferencing returns the live node programs whose command line
// mentions dir. Zombies (no exe link) are left out: their parent reaps them.
func pidsReferencing(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !slices.Contains(nodeExecutables, filepath.Base(strings.TrimSuffix(exe, " (deleted)"))) {
			continue // a kernel thread, a zombie, or not a node program
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), dir) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype string
}

func readMounts() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mount
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		// id parent major:minor root point options [optional...] - fstype source super
		fields := strings.Fields(s.Text())
		if len(fields) < 10 {
			continue
		}
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mount{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsUnder returns the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	dir = filepath.Clean(dir)
	var out []string
	for _, m := range readMounts() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	sort.SliceStable(out, func(i, k int) bool { return len(out[i]) > len(out[k]) })
	return out
}

// unmountUnder detaches every mount at or below dir, deepest first, until
// none is left (a point can be mounted over more than once).
func unmountUnder(dir string) error {
	for range 20 {
		points := MountsUnder(dir)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("unmounting %s: %w", p, err)
			}
		}
	}
	return fmt.Errorf("mounts left under %s: %v", dir, MountsUnder(dir))
}
