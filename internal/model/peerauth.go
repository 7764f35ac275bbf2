package model

import (
	security "istio.io/api/security/v1beta1"
)

// MTLSMode is how a workload's inbound ports accept connections.
type MTLSMode int

// Inbound mTLS modes, as PeerAuthentication names them.
const (
	// Permissive accepts mTLS and plaintext (the default).
	Permissive MTLSMode = iota
	// Strict accepts mTLS only.
	Strict
	// Disable accepts plaintext only.
	Disable
)

// PeerAuthentication is a PeerAuthentication resource.
type PeerAuthentication struct {
	Name, Namespace string
	Spec            *security.PeerAuthentication
}

// InboundMTLS returns the mTLS mode of one of the proxy's ports (see
// WorkloadMTLS).
func (pc *PushContext) InboundMTLS(p *Proxy, port uint32) MTLSMode {
	return pc.WorkloadMTLS(p.Namespace, p.Labels, port)
}

// WorkloadMTLS returns the mTLS mode of a port of the workload with
// labels in namespace: the port-level setting of the PeerAuthentication
// selecting the workload, else its mode, else its namespace's, else the
// root namespace's, else permissive. UNSET inherits from the next level.
func (pc *PushContext) WorkloadMTLS(namespace string, labels map[string]string, port uint32) MTLSMode {
	var chain []*security.PeerAuthentication
	for _, pa := range pc.WorkloadPeerAuthentications(namespace, labels) {
		chain = append(chain, pa.Spec)
	}
	for i, pa := range chain {
		if i == 0 && len(pa.GetSelector().GetMatchLabels()) > 0 {
			if m, ok := pa.GetPortLevelMtls()[port]; ok {
				if mode, set := mtlsMode(m.GetMode()); set {
					return mode
				}
			}
		}
		if mode, set := mtlsMode(pa.GetMtls().GetMode()); set {
			return mode
		}
	}
	return Permissive
}

// WorkloadPeerAuthentications are the PeerAuthentications that decide the
// mTLS mode of the workload with labels in namespace, the first deciding
// first: the one of its namespace selecting it, its namespace's without a
// selector, the root namespace's without a selector (each level's first
// by precedence order), as many of them as there are.
func (pc *PushContext) WorkloadPeerAuthentications(namespace string, labels map[string]string) []*PeerAuthentication {
	var chain []*PeerAuthentication
	for _, pa := range pc.cfg.peerAuth[namespace] {
		sel := pa.Spec.GetSelector().GetMatchLabels()
		if len(sel) > 0 && LabelsMatch(sel, labels) {
			chain = append(chain, pa)
			break
		}
	}
	for _, ns := range []string{namespace, pc.RootNamespace} {
		for _, pa := range pc.cfg.peerAuth[ns] {
			if len(pa.Spec.GetSelector().GetMatchLabels()) == 0 {
				chain = append(chain, pa)
				break
			}
		}
	}
	return chain
}

func mtlsMode(m security.PeerAuthentication_MutualTLS_Mode) (MTLSMode, bool) {
	switch m {
	case security.PeerAuthentication_MutualTLS_STRICT:
		return Strict, true
	case security.PeerAuthentication_MutualTLS_PERMISSIVE:
		return Permissive, true
	case security.PeerAuthentication_MutualTLS_DISABLE:
		return Disable, true
	default:
		return Permissive, false
	}
}
