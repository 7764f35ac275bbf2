package connect

import (
	"context"
	"fmt"
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
