package manifests

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names the checks rely on. Renaming one in the manifests means renaming it here.
const (
	sidecarName   = "kvroute"        // the native sidecar container
	vllmName      = "vllm"           // the vLLM (or simulator) container
	apiService    = "kvroute"        // ClusterIP Service for clients
	gossipService = "kvroute-gossip" // headless Service for --join
	drainPath     = "/drain/prestop"
	// drainMargin is what the grace period needs beyond the drain: vLLM's exit
	// after SIGTERM and the sidecar's own shutdown.
	drainMargin = 30 * time.Second
)

// flagSet maps a binary's flag names to whether the flag is boolean.
type flagSet map[string]bool

// flagDecl matches flag declarations on a *flag.FlagSet named fs:
// fs.StringVar(&c.Listen, "listen", ...), fs.Var(&names, "served-model-name", ...),
// fs.Bool("enable-prompt-tokens-details", ...).
var flagDecl = regexp.MustCompile(`fs\.(\w+)\((?:&[\w.]+, )?"([a-z0-9-]+)"`)

func parseFlagNames(src string) flagSet {
	fs := flagSet{}
	for _, m := range flagDecl.FindAllStringSubmatch(src, -1) {
		fs[m[2]] = m[1] == "BoolVar" || m[1] == "Bool"
	}
	return fs
}

// flagSets are the flags of the two binaries the manifests run.
type flagSets struct{ Sidecar, Sim flagSet }

// parsedArgs are a container's arguments after $(VAR) expansion.
type parsedArgs struct {
	Flags      map[string]string
	Positional []string
}

// parseArgs reads --name=value and boolean --name arguments. The manifests
// use the = form only, so that a flag's value can never be mistaken for a
// positional argument.
func parseArgs(args []string, fs flagSet, env map[string]string, who string) (parsedArgs, []string) {
	var probs []string
	p := parsedArgs{Flags: map[string]string{}}
	for _, a := range args {
		v, undefined := expand(a, env)
		for _, u := range undefined {
			probs = append(probs, fmt.Sprintf("%s: argument %q references $(%s), which is not in the container's env", who, a, u))
		}
		if !strings.HasPrefix(v, "-") {
			p.Positional = append(p.Positional, v)
			continue
		}
		n, val, hasVal := strings.Cut(strings.TrimLeft(v, "-"), "=")
		isBool, known := fs[n]
		switch {
		case !known:
			probs = append(probs, fmt.Sprintf("%s: unknown flag --%s", who, n))
		case !hasVal && !isBool:
			probs = append(probs, fmt.Sprintf("%s: flag --%s needs the --%s=value form", who, n, n))
		}
		if _, dup := p.Flags[n]; dup {
			probs = append(probs, fmt.Sprintf("%s: flag --%s given twice", who, n))
		}
		p.Flags[n] = val
	}
	return p, probs
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand does Kubernetes' $(VAR) expansion of args; $$ escapes. Kubernetes
// leaves an undefined reference verbatim, which is never what was meant, so
// those are returned.
func expand(s string, env map[string]string) (string, []string) {
	var undefined []string
	out := varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		n := m[2 : len(m)-1]
		v, ok := env[n]
		if !ok {
			undefined = append(undefined, n)
			return m
		}
		return v
	})
	return out, undefined
}

// containerEnv maps env names to values; downward-API and secret values become
// placeholders such as <metadata.name>, equal across containers.
func containerEnv(c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch f := e.ValueFrom; {
		case f == nil:
			env[e.Name] = e.Value
		case f.FieldRef != nil:
			env[e.Name] = "<" + f.FieldRef.FieldPath + ">"
		case f.ResourceFieldRef != nil:
			env[e.Name] = "<" + f.ResourceFieldRef.ContainerName + ":" + f.ResourceFieldRef.Resource + ">"
		case f.SecretKeyRef != nil:
			env[e.Name] = "<secret:" + f.SecretKeyRef.Name + "/" + f.SecretKeyRef.Key + ">"
		default:
			env[e.Name] = "<ref>"
		}
	}
	return env
}

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func containerPort(c *corev1.Container, name string) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

// resolvePort resolves a probe's or hook's port in its own container, as the
// kubelet does.
func resolvePort(c *corev1.Container, p intstr.IntOrString) (int, bool) {
	if p.Type == intstr.Int {
		return int(p.IntVal), true
	}
	cp, ok := containerPort(c, p.StrVal)
	return int(cp.ContainerPort), ok
}

// hostPort splits "host:port", "tcp://host:port" or "http://host:port".
func hostPort(s string) (string, int, error) {
	if strings.Contains(s, "://") {
		u, err := url.Parse(strings.Replace(s, "*", "0.0.0.0", 1))
		if err != nil {
			return "", 0, err
		}
		s = u.Host
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	return h, n, err
}

func isLoopback(h string) bool {
	ip := net.ParseIP(h)
	return h == "localhost" || (ip != nil && ip.IsLoopback())
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// eventsConfig is vLLM's --kv-events-config (docs/reference/vllm-interface.md §1.1), decoded
// strictly so that a misspelt field is caught.
type eventsConfig struct {
	Enable         bool   `json:"enable_kv_cache_events"`
	Publisher      string `json:"publisher"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	BufferSteps    int    `json:"buffer_steps"`
	HWM            int    `json:"hwm"`
	MaxQueueSize   int    `json:"max_queue_size"`
	Topic          string `json:"topic"`
}

// binds is vLLM's rule for its PUB socket (ZmqEventPublisher._socket_setup).
func binds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// checker collects the problems of one bundle.
type checker struct {
	b     *bundle
	flags flagSets
	probs []string
}

func (c *checker) errorf(format string, args ...any) {
	c.probs = append(c.probs, fmt.Sprintf(format, args...))
}

// check returns every problem found in b; none means the manifests agree with
// themselves and with the binaries' flags.
func check(b *bundle, flags flagSets) []string {
	c := &checker{b: b, flags: flags}
	c.run()
	return c.probs
}

func (c *checker) run() {
	b := c.b
	if len(b.Deployments) != 1 {
		c.errorf("want exactly one Deployment, got %d", len(b.Deployments))
		return
	}
	d := b.Deployments[0]
	pod := &d.Spec.Template.Spec
	labels := d.Spec.Template.Labels
	c.selectors(labels)
	if findContainer(pod.Containers, sidecarName) != nil {
		c.errorf("sidecar %q is a regular container; it must be a native sidecar in initContainers", sidecarName)
	}
	side := findContainer(pod.InitContainers, sidecarName)
	vllm := findContainer(pod.Containers, vllmName)
	if side == nil || vllm == nil {
		c.errorf("want initContainer %q and container %q", sidecarName, vllmName)
		return
	}
	if side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		c.errorf("sidecar: restartPolicy must be Always (a native sidecar); otherwise the pod waits for it to exit")
	}
	sf := c.sidecarFlags(side)
	vf := c.vllmFlags(vllm)

	listen, admin, gossip := c.port(sf, "listen"), c.port(sf, "admin-listen"), c.intFlag(sf, "gossip-port")
	c.containerPortIs(side, "http", listen, corev1.ProtocolTCP)
	c.containerPortIs(side, "admin", admin, corev1.ProtocolTCP)
	c.containerPortIs(side, "gossip-tcp", gossip, corev1.ProtocolTCP)
	c.containerPortIs(side, "gossip-udp", gossip, corev1.ProtocolUDP)
	c.probe(side, "sidecar liveness", side.LivenessProbe, admin, "/livez")
	c.probe(side, "sidecar readiness", side.ReadinessProbe, admin, "/readyz")
	c.services(pod, listen, gossip)
	c.join(sf, gossip)
	c.events(sf, vf)

	vport := c.intFlag(vf, "port")
	if _, up, err := hostPort(sf.Flags["vllm-url"]); err != nil || up != vport {
		c.errorf("sidecar --vllm-url=%s does not reach vLLM's --port=%d", sf.Flags["vllm-url"], vport)
	}
	if h := vf.Flags["host"]; isLoopback(h) {
		c.errorf("vLLM --host=%s: the kubelet's probes connect to the pod IP and cannot reach it", h)
	}
	c.containerPortIs(vllm, "vllm", vport, corev1.ProtocolTCP)
	c.probe(vllm, "vLLM startup", vllm.StartupProbe, vport, "/health")
	c.probe(vllm, "vLLM readiness", vllm.ReadinessProbe, vport, "/v1/models")
	c.probe(vllm, "vLLM liveness", vllm.LivenessProbe, vport, "/health")

	c.drain(d.Spec.Template.Spec.TerminationGracePeriodSeconds, vllm, sf, admin)
	if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxSurge == nil || s.MaxSurge.String() != "0" && s.MaxSurge.String() != "0%" {
		c.errorf("rollout: maxSurge must be 0 (a surge pod waits forever for a fully allocated GPU)")
	}
	c.secret(side, pod, sf)
	c.resources(side)
	c.networkPolicy(labels, side, vllm, listen, admin, gossip, vport)
	if len(b.PDBs) != 1 || b.PDBs[0].Spec.MaxUnavailable == nil && b.PDBs[0].Spec.MinAvailable == nil {
		c.errorf("want one PodDisruptionBudget with maxUnavailable or minAvailable")
	}
	c.serviceAccount(pod)
}

func (c *checker) selectors(labels map[string]string) {
	d := c.b.Deployments[0]
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchExpressions) > 0 || !subset(d.Spec.Selector.MatchLabels, labels) {
		c.errorf("Deployment selector %v does not match template labels %v", d.Spec.Selector, labels)
	}
	for _, s := range c.b.Services {
		if !subset(s.Spec.Selector, labels) {
			c.errorf("Service %s selector %v does not match the pods' labels %v", s.Name, s.Spec.Selector, labels)
		}
	}
	for _, p := range c.b.PDBs {
		if p.Spec.Selector == nil || !subset(p.Spec.Selector.MatchLabels, labels) {
			c.errorf("PodDisruptionBudget %s selector does not match the pods' labels", p.Name)
		}
	}
	for _, t := range d.Spec.Template.Spec.TopologySpreadConstraints {
		if t.LabelSelector == nil || !subset(t.LabelSelector.MatchLabels, labels) {
			c.errorf("topologySpreadConstraint on %s does not select the pods", t.TopologyKey)
		}
	}
}

// sidecarFlags merges the sidecar's args and KVROUTE_<NAME> env twins.
func (c *checker) sidecarFlags(side *corev1.Container) parsedArgs {
	env := containerEnv(side)
	p, probs := parseArgs(side.Args, c.flags.Sidecar, env, "sidecar")
	c.probs = append(c.probs, probs...)
	if len(p.Positional) > 1 || len(p.Positional) == 1 && p.Positional[0] != "serve" {
		c.errorf("sidecar: unexpected positional arguments %q (only the subcommand serve)", p.Positional)
	}
	for _, e := range side.Env {
		n, ok := strings.CutPrefix(e.Name, "KVROUTE_")
		if !ok {
			continue
		}
		flag := strings.ToLower(strings.ReplaceAll(n, "_", "-"))
		if _, known := c.flags.Sidecar[flag]; !known {
			c.errorf("sidecar: env %s is the twin of no flag", e.Name)
			continue
		}
		if _, dup := p.Flags[flag]; dup {
			c.errorf("sidecar: --%s set both as argument and as env %s", flag, e.Name)
		}
		p.Flags[flag] = env[e.Name]
	}
	// The manifests state what they depend on rather than lean on defaults.
	for _, f := range []string{"listen", "admin-listen", "vllm-url", "kv-events-endpoint", "node-name", "advertise-addr",
		"gossip-port", "join", "cluster-secret-file", "cluster-label", "drain-timeout"} {
		if _, ok := p.Flags[f]; !ok {
			c.errorf("sidecar: --%s is not set explicitly", f)
		}
	}
	if p.Flags["node-name"] != "<metadata.name>" || p.Flags["advertise-addr"] != "<status.podIP>" {
		c.errorf("sidecar: --node-name and --advertise-addr must come from the downward API (pod name, pod IP), got %q, %q",
			p.Flags["node-name"], p.Flags["advertise-addr"])
	}
	return p
}

// vllmFlags parses vLLM's args. Both vLLM and the simulator take these flag
// names, so they are checked against the simulator's flag set; --sim-* flags
// are only for the simulator's image.
func (c *checker) vllmFlags(v *corev1.Container) parsedArgs {
	p, probs := parseArgs(v.Args, c.flags.Sim, containerEnv(v), "vllm")
	c.probs = append(c.probs, probs...)
	sim := strings.Contains(v.Image, "vllm-sim")
	for f := range p.Flags {
		if strings.HasPrefix(f, "sim-") && !sim {
			c.errorf("vllm: --%s is a simulator flag but the image is %s", f, v.Image)
		}
	}
	if len(p.Positional) != 1 {
		c.errorf("vllm: want the model as the one positional argument, got %q", p.Positional)
	}
	if p.Flags["prefix-caching-hash-algo"] != "sha256_cbor" {
		c.errorf("vllm: --prefix-caching-hash-algo must be sha256_cbor")
	}
	return p
}

func (c *checker) port(p parsedArgs, flag string) int {
	_, n, err := hostPort(p.Flags[flag])
	if err != nil {
		c.errorf("--%s=%q: %v", flag, p.Flags[flag], err)
	}
	return n
}

func (c *checker) intFlag(p parsedArgs, flag string) int {
	n, err := strconv.Atoi(p.Flags[flag])
	if err != nil {
		c.errorf("--%s=%q: %v", flag, p.Flags[flag], err)
	}
	return n
}

func (c *checker) containerPortIs(ct *corev1.Container, name string, port int, proto corev1.Protocol) {
	cp, ok := containerPort(ct, name)
	if !ok || int(cp.ContainerPort) != port || cp.Protocol != proto {
		c.errorf("%s: container port %q must be %d/%s to match the flags, got %+v", ct.Name, name, port, proto, cp)
	}
}

func (c *checker) probe(ct *corev1.Container, what string, p *corev1.Probe, port int, path string) {
	if p == nil || p.HTTPGet == nil {
		c.errorf("%s probe: missing (want httpGet %s on %d)", what, path, port)
		return
	}
	got, ok := resolvePort(ct, p.HTTPGet.Port)
	if !ok || got != port || p.HTTPGet.Path != path {
		c.errorf("%s probe: httpGet %s on %s, want %s on %d", what, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, port)
	}
}

// targetPort resolves a Service's targetPort against every container of the
// pod, as the endpoints controller does.
func targetPort(pod *corev1.PodSpec, sp corev1.ServicePort) int {
	if sp.TargetPort.Type == intstr.Int {
		if sp.TargetPort.IntVal == 0 {
			return int(sp.Port)
		}
		return int(sp.TargetPort.IntVal)
	}
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range cs {
			if cp, ok := containerPort(&cs[i], sp.TargetPort.StrVal); ok {
				return int(cp.ContainerPort)
			}
		}
	}
	return -1
}

func (c *checker) services(pod *corev1.PodSpec, listen, gossip int) {
	api := c.b.service(apiService)
	if api == nil || len(api.Spec.Ports) == 0 {
		c.errorf("Service %s is missing", apiService)
	} else {
		if api.Spec.ClusterIP == corev1.ClusterIPNone {
			c.errorf("Service %s must not be headless: clients need one virtual IP", apiService)
		}
		for _, sp := range api.Spec.Ports {
			if tp := targetPort(pod, sp); tp != listen {
				c.errorf("Service %s port %d targets %d, want the sidecar's --listen port %d", apiService, sp.Port, tp, listen)
			}
		}
	}
	g := c.b.service(gossipService)
	if g == nil {
		c.errorf("Service %s is missing", gossipService)
		return
	}
	if g.Spec.ClusterIP != corev1.ClusterIPNone || !g.Spec.PublishNotReadyAddresses {
		c.errorf("Service %s must be headless with publishNotReadyAddresses (pods loading a model must still find each other)", gossipService)
	}
	protos := map[corev1.Protocol]bool{}
	for _, sp := range g.Spec.Ports {
		if targetPort(pod, sp) == gossip && sp.Port == int32(gossip) {
			protos[sp.Protocol] = true
		}
	}
	if !protos[corev1.ProtocolTCP] || !protos[corev1.ProtocolUDP] {
		c.errorf("Service %s needs port %d on TCP and UDP, got %v", gossipService, gossip, g.Spec.Ports)
	}
}

func (c *checker) join(sf parsedArgs, gossip int) {
	seeds := strings.Split(sf.Flags["join"], ",")
	for _, s := range seeds {
		h, p, err := hostPort(strings.TrimSpace(s))
		if err != nil || p != gossip {
			c.errorf("sidecar --join %q: want host:%d", s, gossip)
			continue
		}
		if svc, _, _ := strings.Cut(h, "."); svc != gossipService {
			c.errorf("sidecar --join %q does not name the headless Service %s", s, gossipService)
		}
	}
}

// events checks that the sidecar dials, on loopback, the sockets vLLM binds,
// and subscribes to a prefix of vLLM's topic.
func (c *checker) events(sf, vf parsedArgs) {
	var ec eventsConfig
	dec := json.NewDecoder(strings.NewReader(vf.Flags["kv-events-config"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ec); err != nil {
		c.errorf("vllm --kv-events-config: %v", err)
		return
	}
	if !ec.Enable || ec.Publisher != "zmq" {
		c.errorf("vllm --kv-events-config: want enable_kv_cache_events true and publisher zmq (older vLLM defaults to null)")
	}
	pairs := []struct{ what, vllm, side string }{
		{"kv-events-endpoint", ec.Endpoint, sf.Flags["kv-events-endpoint"]},
		{"kv-events-replay-endpoint", ec.ReplayEndpoint, sf.Flags["kv-events-replay-endpoint"]},
	}
	for _, p := range pairs {
		if p.vllm == "" && p.side == "" {
			continue
		}
		if !binds(p.vllm) {
			c.errorf("%s: vLLM endpoint %q connects out; the sidecar dials, so vLLM must bind", p.what, p.vllm)
			continue
		}
		if strings.HasPrefix(p.vllm, "ipc://") {
			if p.side != p.vllm {
				c.errorf("sidecar --%s=%s, vLLM binds %s", p.what, p.side, p.vllm)
			}
			continue
		}
		_, vp, err1 := hostPort(p.vllm)
		sh, sp, err2 := hostPort(p.side)
		if err1 != nil || err2 != nil || vp != sp || !isLoopback(sh) {
			c.errorf("sidecar --%s=%s must dial vLLM's %s on loopback", p.what, p.side, p.vllm)
		}
	}
	if !strings.HasPrefix(ec.Topic, sf.Flags["kv-events-topic"]) {
		c.errorf("sidecar --kv-events-topic=%q is not a prefix of vLLM's topic %q", sf.Flags["kv-events-topic"], ec.Topic)
	}
}

func (c *checker) drain(grace *int64, vllm *corev1.Container, sf parsedArgs, admin int) {
	timeout, err := time.ParseDuration(sf.Flags["drain-timeout"])
	if err != nil {
		c.errorf("sidecar --drain-timeout: %v", err)
	}
	if grace == nil || time.Duration(*grace)*time.Second < timeout+drainMargin {
		c.errorf("terminationGracePeriodSeconds must cover --drain-timeout=%v plus %v for vLLM's and the sidecar's exit", timeout, drainMargin)
	}
	if vllm.Lifecycle == nil || vllm.Lifecycle.PreStop == nil || vllm.Lifecycle.PreStop.HTTPGet == nil {
		c.errorf("vllm: want a preStop httpGet to the sidecar's %s", drainPath)
		return
	}
	h := vllm.Lifecycle.PreStop.HTTPGet
	if h.Port.Type != intstr.Int {
		c.errorf("vllm preStop: port %q is a name, which the kubelet resolves in vLLM's own container; give the admin port's number", h.Port.StrVal)
	} else if int(h.Port.IntVal) != admin || h.Path != drainPath || h.Host != "" {
		c.errorf("vllm preStop: httpGet %s%s on %d, want %s on the sidecar's admin port %d", h.Host, h.Path, h.Port.IntVal, drainPath, admin)
	}
}

func (c *checker) secret(side *corev1.Container, pod *corev1.PodSpec, sf parsedArgs) {
	for _, s := range c.b.Secrets {
		c.errorf("Secret %s is in the manifests; a committed key is a shared key (create it per cluster)", s.Name)
	}
	file := sf.Flags["cluster-secret-file"]
	for _, m := range side.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			s := v.Secret
			switch {
			case s == nil:
				c.errorf("--cluster-secret-file %s is on volume %s, which is not a Secret", file, v.Name)
			case s.Optional != nil && *s.Optional:
				c.errorf("secret volume %s is optional: a pod without the key would run an unauthenticated mesh", v.Name)
			case len(s.Items) > 0 && !slices.ContainsFunc(s.Items, func(k corev1.KeyToPath) bool { return k.Path == rel }):
				c.errorf("secret volume %s does not project %s", v.Name, rel)
			}
			return
		}
	}
	c.errorf("--cluster-secret-file %s is not on a mounted volume", file)
}

func (c *checker) resources(side *corev1.Container) {
	r := side.Resources
	if _, ok := r.Limits[corev1.ResourceCPU]; ok {
		c.errorf("sidecar: no CPU limit (throttling adds latency to every proxied request)")
	}
	lim, ok1 := r.Limits[corev1.ResourceMemory]
	req, ok2 := r.Requests[corev1.ResourceMemory]
	if !ok1 || !ok2 || lim.Cmp(req) != 0 {
		c.errorf("sidecar: memory limit must equal its request")
	}
	for _, e := range side.Env {
		if e.Name == "GOMEMLIMIT" {
			f := e.ValueFrom
			if f == nil || f.ResourceFieldRef == nil || f.ResourceFieldRef.ContainerName != side.Name || f.ResourceFieldRef.Resource != "limits.memory" {
				c.errorf("sidecar: GOMEMLIMIT must come from its own limits.memory")
			}
		}
	}
}

// admits reports whether rule lets TCP/UDP traffic to port in.
func admits(rule networkingv1.NetworkPolicyIngressRule, pod *corev1.PodSpec, cp corev1.ContainerPort) bool {
	if len(rule.Ports) == 0 {
		return true
	}
	for _, p := range rule.Ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto != cp.Protocol {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String && p.Port.StrVal == cp.Name:
			return true
		case p.Port.Type == intstr.Int && p.EndPort != nil && cp.ContainerPort >= p.Port.IntVal && cp.ContainerPort <= *p.EndPort:
			return true
		case p.Port.Type == intstr.Int && p.Port.IntVal == cp.ContainerPort:
			return true
		}
	}
	return false
}

// fromPods reports whether rule admits only the pods with labels: every peer a podSelector
// that selects them, in the policy's own namespace (no namespaceSelector, no ipBlock).
func fromPods(rule networkingv1.NetworkPolicyIngressRule, labels map[string]string) bool {
	return len(rule.From) > 0 && !slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool {
		return p.NamespaceSelector != nil || p.IPBlock != nil || p.PodSelector == nil || !subset(p.PodSelector.MatchLabels, labels)
	})
}

// networkPolicy checks the ingress allow-list. vLLM's HTTP port (vport: its --port, the
// container port "vllm") is open to the Deployment's own pods only: a peer sidecar asks this
// pod's vLLM about a stored response while this pod's sidecar is away (forward/direct.go,
// --engine-advertise-addr). Its other ports, the KV-event sockets, stay closed to every pod.
// The chart's plainService also opens vport to the API's clients; charts/kvroute/test checks
// that rule, as these manifests have no such Service.
func (c *checker) networkPolicy(labels map[string]string, side, vllm *corev1.Container, listen, admin, gossip, vport int) {
	var pols []*networkingv1.NetworkPolicy
	for _, p := range c.b.NetworkPolicies {
		if subset(p.Spec.PodSelector.MatchLabels, labels) && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			pols = append(pols, p)
		}
	}
	if len(pols) == 0 {
		c.errorf("no NetworkPolicy isolates the pods' ingress: vLLM's KV-event sockets would be open to every pod")
		return
	}
	pod := &c.b.Deployments[0].Spec.Template.Spec
	rulesFor := func(cp corev1.ContainerPort) []networkingv1.NetworkPolicyIngressRule {
		var rs []networkingv1.NetworkPolicyIngressRule
		for _, p := range pols {
			for _, r := range p.Spec.Ingress {
				if admits(r, pod, cp) {
					rs = append(rs, r)
				}
			}
		}
		return rs
	}
	for _, cp := range vllm.Ports {
		rs := rulesFor(cp)
		if int(cp.ContainerPort) == vport && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
			if len(rs) == 0 {
				c.errorf("NetworkPolicy closes vLLM's HTTP port %s (%d) to the Deployment's pods: while a pod's sidecar is away, "+
					"peers cannot ask its vLLM for a stored response, and stored-response follow-ups then wait 10 s for their 404", cp.Name, cp.ContainerPort)
			}
			for _, r := range rs {
				if !fromPods(r, labels) {
					c.errorf("NetworkPolicy admits vLLM's HTTP port %s (%d) from outside the Deployment's pods: only peer sidecars may call it directly", cp.Name, cp.ContainerPort)
				}
			}
			continue
		}
		if len(rs) > 0 {
			c.errorf("NetworkPolicy admits other pods to vLLM's port %s (%d): only the sidecar, on loopback, may use it", cp.Name, cp.ContainerPort)
		}
	}
	for _, cp := range side.Ports {
		rs := rulesFor(cp)
		switch int(cp.ContainerPort) {
		case listen, admin:
			if len(rs) == 0 {
				c.errorf("NetworkPolicy closes the sidecar's port %s (%d)", cp.Name, cp.ContainerPort)
			}
		case gossip:
			if len(rs) == 0 {
				c.errorf("NetworkPolicy closes gossip %d/%s between the pods", gossip, cp.Protocol)
			}
			for _, r := range rs {
				if !fromPods(r, labels) {
					c.errorf("NetworkPolicy admits gossip %d/%s from outside the Deployment's pods", gossip, cp.Protocol)
				}
			}
		}
	}
}

func (c *checker) serviceAccount(pod *corev1.PodSpec) {
	for _, sa := range c.b.ServiceAccounts {
		if sa.Name == pod.ServiceAccountName {
			if (pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken) &&
				(sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken) {
				c.errorf("pod mounts an API token it does not use")
			}
			return
		}
	}
	c.errorf("ServiceAccount %q is not in the manifests", pod.ServiceAccountName)
}
