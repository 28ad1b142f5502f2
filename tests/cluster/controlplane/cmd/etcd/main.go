// Command etcd is etcd's own server entry point, built from the same go.etcd.io/etcd/server/v3
// version that k8s.io/kubernetes requires (Debian's etcd 3.4 is too old for it).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
