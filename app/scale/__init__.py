"""The Kubernetes scale convention: `/v1/deployments/{name}/scale` in the `autoscaling/v1` Scale shape."""
