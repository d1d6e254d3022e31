//! PCIe switch details from Linux sysfs (in progress).
