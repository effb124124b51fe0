// Command kube runs one Kubernetes component per process, chosen by the name it is called by (a
// link named kubectl, say) or else by its first argument: kube-apiserver, kube-controller-manager,
// kube-scheduler, kubectl or etcd. One binary links them once (a link of k8s.io/kubernetes costs
// minutes and gigabytes on two cores); each component still runs as a process of its own, so
// process-wide state (flags, feature gates, metrics registries) is never shared. Test tooling only:
// upstream's own commands, no logic of ours.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins, as upstream's main
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd"}

func main() {
	component, rest := filepath.Base(os.Args[0]), os.Args[1:]
	if !known(component) {
		if len(os.Args) < 2 || !known(os.Args[1]) {
			fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [flags], COMPONENT one of %v\n", components)
			os.Exit(2)
		}
		component, rest = os.Args[1], os.Args[2:]
	}
	os.Args = append([]string{component}, rest...)
	switch component {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kubectl":
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	default:
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	}
}

func known(name string) bool {
	for _, c := range components {
		if c == name {
			return true
		}
	}
	return false
}
