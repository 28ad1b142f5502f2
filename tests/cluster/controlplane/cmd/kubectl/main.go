// kubectl for the e2e tests (`kubectl apply -k deploy/`), from the same Kubernetes release as
// the API server: what k8s.io/kubernetes/cmd/kubectl builds.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
