"""Training FLOPs and the devices that run them, knowing nothing of comparisons: `vlkit.flops.count` counts a
training step of any model, objective mix or task with torch's own counter on the meta device; `vlkit.flops.devices`
holds the devices' peaks and default MFUs and the one rule that picks a device. `vlkit.compare.costs` prices a
comparison's units with them."""
