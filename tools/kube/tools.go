//go:build tools

// Package kube pins the cluster that internal/testsupport/kubeenv runs for tests:
// kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy, and kwok's
// simulated nodes (built against the same Kubernetes modules, so they share
// one build). It is its own module so the heavy k8s.io/kubernetes dependency
// stays out of every service module.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
