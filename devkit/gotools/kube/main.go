// Command kube runs one Kubernetes control-plane component per process, chosen by its first
// argument: kube-apiserver, kube-controller-manager, kube-scheduler or etcd. One binary links the
// four once (a link of k8s.io/kubernetes costs minutes and gigabytes on two cores); each component
// still runs as a process of its own, so process-wide state (flags, feature gates, metrics
// registries) is never shared. Test tooling only: flags and process control, no logic of ours.
package main

import (
	"fmt"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube kube-apiserver|kube-controller-manager|kube-scheduler|etcd [flags]")
		os.Exit(2)
	}
	component, rest := os.Args[1], os.Args[2:]
	switch component {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, rest...))
		return
	case "kube-apiserver", "kube-controller-manager", "kube-scheduler":
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q (kube-apiserver, kube-controller-manager, kube-scheduler, etcd)\n", component)
		os.Exit(2)
	}
	os.Args = append([]string{component}, rest...)
	switch component {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	default:
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	}
}
