"""Tests of the Kubernetes side (elector.kube), against the kmock Kubernetes API emulator."""
