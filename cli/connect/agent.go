package connect

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// agentStatusPort is the agent's status port in a pod (15020).
const agentStatusPort = 15020

// AgentAddress is where the agent of a proxy (named pod.namespace) serves
// its status port: given (--agent-address), the context file's, or in a
// cluster the pod's port through port-forward; stop releases it.
func (o *Options) AgentAddress(ctx context.Context, given, pod, namespace string) (addr string, stop func(), err error) {
	if given != "" {
		return given, func() {}, nil
	}
	if o.Kube.Enabled() {
		return o.Kube.ForwardPod(ctx, namespace, pod, agentStatusPort)
	}
	c, err := o.resolve()
	if err != nil {
		return "", nil, err
	}
	if a := c.AgentAddresses[pod+"."+namespace]; a != "" {
		return a, func() {}, nil
	}
	return "", nil, fmt.Errorf("where is the agent of %s.%s? give --agent-address (its status port, %d in a pod), or --kubeconfig", pod, namespace, agentStatusPort)
}

// AgentDo sends method path to the status port of the agent of proxy
// (pod.namespace, or its node ID; the agent found as AgentAddress finds
// it) and returns the answer's body, read to at most limit bytes; an
// answer other than 200 is an error carrying what the agent said.
func (o *Options) AgentDo(ctx context.Context, given, proxy, method, path string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	name := ProxyName(proxy)
	i := strings.LastIndex(name, ".")
	if i <= 0 || i == len(name)-1 {
		return nil, fmt.Errorf("%q: want the proxy as pod.namespace (or its node ID)", proxy)
	}
	addr, stop, err := o.AgentAddress(ctx, given, name[:i], name[i+1:])
	if err != nil {
		return nil, err
	}
	defer stop()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, nil)
	if err != nil {
		return nil, fmt.Errorf("the agent at %s: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("the agent of %s at %s: %w", name, addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("the agent of %s at %s: %w", name, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the agent of %s at %s: %s: %s", name, addr, resp.Status, strings.TrimSpace(string(body[:min(len(body), 4096)])))
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("the agent of %s at %s: %s answers more than %d MiB", name, addr, path, limit>>20)
	}
	return body, nil
}
