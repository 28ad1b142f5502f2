// Command kube-scheduler is upstream kube-scheduler with scheduler-plugins' Coscheduling plugin
// compiled in: the stack OpenAI ran for gangs, and what tests/cluster/bench.sh races Gantry
// against. The same entry point as scheduler-plugins' cmd/scheduler, with one plugin.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers the plugins' config types (CoschedulingArgs) with the scheduler's scheme.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(coscheduling.Name, coscheduling.New))))
}
