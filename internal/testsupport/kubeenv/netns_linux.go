package kubeenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// netnsEnv marks the test binary RunInNetworkNamespace re-executed;
// hostsEnv names the file it mounted over /etc/hosts there.
const (
	netnsEnv = "FLOTILLA_KUBEENV_NETNS"
	hostsEnv = "FLOTILLA_KUBEENV_HOSTS"
)

// inNetworkNamespace reports whether this process runs in the namespaces
// RunInNetworkNamespace made, where a cluster may program the network.
func inNetworkNamespace() bool { return os.Getenv(netnsEnv) == "1" }

// RunInNetworkNamespace runs run (a TestMain's body) in a network and a
// mount namespace of the test binary's own, made by re-executing it under
// `unshare --net --mount`, in which the loopback interface is up and the
// whole PodNetwork and ServiceNetwork are local (local routes, as
// 127.0.0.0/8 is): a process can listen at any pod's IP that kwok hands
// out, and the apiserver, the tests and the other processes reach it
// there, as in a cluster. /etc/hosts is a file of the namespace's own,
// where a cluster started there (Options.Cluster) writes its Services'
// names, and its kube-proxy translates their cluster IPs. Nothing leaves
// the namespaces, which go away with the last process in them. It needs
// root, util-linux's unshare and mount, and iproute2's ip and nftables'
// nft; without them it says so.
func RunInNetworkNamespace(run func() int) int {
	if inNetworkNamespace() {
		if err := setupNetworkNamespace(); err != nil {
			fmt.Fprintln(os.Stderr, "kubeenv: network namespace:", err)
			return 1
		}
		return run()
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kubeenv: a network namespace of the tests' own needs root (the tests run as root here and in CI)")
		return 1
	}
	for _, tool := range []string{"unshare", "mount", "ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "kubeenv: %s is needed for the tests' network namespace (Debian packages util-linux, mount, iproute2 and nftables; make test installs them): %v\n", tool, err)
			return 1
		}
	}
	hosts, err := os.CreateTemp("", "kubeenv-hosts-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeenv: hosts file:", err)
		return 1
	}
	defer os.Remove(hosts.Name())
	if _, err := hosts.WriteString(baseHosts); err != nil {
		fmt.Fprintln(os.Stderr, "kubeenv: hosts file:", err)
		return 1
	}
	hosts.Close()
	cmd := exec.Command("unshare", append([]string{"--net", "--mount", "--", os.Args[0]}, os.Args[1:]...)...) //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), netnsEnv+"=1", hostsEnv+"="+hosts.Name())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeenv: unshare --net:", err)
		return 1
	}
	return 0
}

func setupNetworkNamespace() error {
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "route", "add", "local", PodNetwork, "dev", "lo"},
		{"ip", "route", "add", "local", ServiceNetwork, "dev", "lo"},
		// unshare --mount made the mounts private: this one is seen in
		// the namespace only.
		{"mount", "--bind", os.Getenv(hostsEnv), "/etc/hosts"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil { //nolint:gosec // fixed commands
			return fmt.Errorf("%v: %w: %s", args, err, out)
		}
	}
	return nil
}
