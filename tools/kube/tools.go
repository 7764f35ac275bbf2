//go:build tools

// Package kube pins the kube-apiserver that internal/kubeenv runs for tests.
// It is its own module so the heavy k8s.io/kubernetes dependency stays out of
// every service module.
package kube

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
