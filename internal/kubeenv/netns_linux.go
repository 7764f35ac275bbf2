package kubeenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// netnsEnv marks the test binary RunInNetworkNamespace re-executed.
const netnsEnv = "FLOTILLA_KUBEENV_NETNS"

// RunInNetworkNamespace runs run (a TestMain's body) in a network namespace
// of the test binary's own, made by re-executing it under `unshare --net`,
// in which the loopback interface is up and the whole PodNetwork is local
// (a local route, as 127.0.0.0/8 is): a process can listen at any pod's IP
// that kwok hands out, and the apiserver, the tests and the other
// processes reach it there, as in a cluster. Nothing leaves the namespace,
// which goes away with the last process in it. It needs root and
// util-linux's unshare and iproute2's ip; without them it says so.
func RunInNetworkNamespace(run func() int) int {
	if os.Getenv(netnsEnv) == "1" {
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
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "kubeenv: %s is needed for the tests' network namespace (Debian packages util-linux and iproute2; make test installs them): %v\n", tool, err)
			return 1
		}
	}
	cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...) //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
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
		{"link", "set", "lo", "up"},
		{"route", "add", "local", PodNetwork, "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
	}
	return nil
}
