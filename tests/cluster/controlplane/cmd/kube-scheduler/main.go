// Command kube-scheduler is the upstream scheduler of the same Kubernetes release as the
// control plane, with its native gang scheduling (the Workload/PodGroup API): the contender
// `bench.sh` races beside kube-scheduler 1.34 + Coscheduling. Same entry point as
// kubernetes/cmd/kube-scheduler.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
