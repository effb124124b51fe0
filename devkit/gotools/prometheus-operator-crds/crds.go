// Package crds pins the prometheus-operator's API types (the source of its CRDs) beside
// controller-gen, which devkit.gobuild runs over them the way the operator's own Makefile does.
// Test tooling only: no logic of ours.
package crds

import (
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1"
)
