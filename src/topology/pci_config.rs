//! What a PCI function's config space says: its PCI Express port type and its ACS control,
//! read from the dump sysfs gives (`/sys/bus/pci/devices/<id>/config`; 64 bytes without root,
//! 256 or 4096 with).

/// What a PCIe bridge is, from the Device/Port Type of its PCI Express capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortType {
    RootPort,
    Upstream,
    Downstream,
    Other,
}

/// Device/Port Type from a config-space dump, when the PCI Express capability is inside it.
pub fn port_type(config: &[u8]) -> Option<PortType> {
    // Status register bit 4: the function has a capability list.
    if config.len() < 0x40 || config[0x06] & 0x10 == 0 {
        return None;
    }
    let mut ptr = (config[0x34] & 0xfc) as usize;
    // At most 48 capabilities fit in 256 bytes; the bound stops a looping list.
    for _ in 0..48 {
        if ptr < 0x40 || ptr + 4 > config.len() {
            return None;
        }
        if config[ptr] == 0x10 {
            let caps = u16::from_le_bytes([config[ptr + 2], config[ptr + 3]]);
            return Some(match (caps >> 4) & 0xf {
                0x4 => PortType::RootPort,
                0x5 => PortType::Upstream,
                0x6 => PortType::Downstream,
                _ => PortType::Other,
            });
        }
        ptr = (config[ptr + 1] & 0xfc) as usize;
    }
    None
}

/// What the ACS capability of a bridge says, from extended config space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acs {
    /// The ACS Control register (PCIe spec 7.7.8.3).
    Control(u16),
    /// The function has extended config space but no ACS capability.
    Absent,
    /// Extended config space could not be read; the phrase says why.
    Unreadable(String),
}

/// ACS Control bits that send peer-to-peer traffic up to the root complex (P2P Request
/// Redirect, P2P Completion Redirect, P2P Egress Control).
pub const ACS_REDIRECTS: u16 = 0b10_1100;

/// The ACS capability in a config-space dump. Extended capabilities start at 0x100; a dump of
/// 256 bytes or less has none to read (non-root users see 64 bytes).
pub fn acs(config: &[u8]) -> Acs {
    if config.len() <= 0x100 {
        return Acs::Unreadable(if config.len() <= 64 {
            format!(
                "only {} bytes of config space are readable (run as root)",
                config.len()
            )
        } else {
            "the function shows no extended config space".into()
        });
    }
    let mut at = 0x100usize;
    // At most (4096 - 256) / 4 headers fit; the bound stops a looping list.
    for _ in 0..960 {
        if at < 0x100 || at + 8 > config.len() {
            return Acs::Absent;
        }
        let h = u32::from_le_bytes([config[at], config[at + 1], config[at + 2], config[at + 3]]);
        if h == 0 || h == u32::MAX {
            return Acs::Absent;
        }
        if h & 0xffff == 0x000d {
            return Acs::Control(u16::from_le_bytes([config[at + 6], config[at + 7]]));
        }
        at = (h >> 20) as usize & !3;
        if at == 0 {
            return Acs::Absent;
        }
    }
    Acs::Absent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_type_from_config_space() {
        let mut cfg = vec![0u8; 256];
        cfg[0x06] = 0x10;
        cfg[0x34] = 0x40;
        cfg[0x40] = 0x01; // power management
        cfg[0x41] = 0x60;
        cfg[0x60] = 0x10; // PCI Express, upstream port
        cfg[0x62] = 0x52;
        assert_eq!(port_type(&cfg), Some(PortType::Upstream));
        cfg[0x62] = 0x42;
        assert_eq!(port_type(&cfg), Some(PortType::RootPort));
        // 64 bytes, as a non-root user reads it: unknown.
        assert_eq!(port_type(&cfg[..64]), None);
        // A capability list that loops ends.
        cfg[0x41] = 0x40;
        assert_eq!(port_type(&cfg), None);
    }

    #[test]
    fn acs_from_extended_config_space() {
        let mut cfg = vec![0u8; 0x200];
        // AER at 0x100 pointing to ACS at 0x148.
        cfg[0x100..0x104].copy_from_slice(&(0x0001u32 | 1 << 16 | 0x148 << 20).to_le_bytes());
        cfg[0x148..0x14c].copy_from_slice(&(0x000du32 | 1 << 16).to_le_bytes());
        cfg[0x14e] = 0x1d;
        assert_eq!(acs(&cfg), Acs::Control(0x1d));
        assert_ne!(0x1d & ACS_REDIRECTS, 0);
        cfg[0x148] = 0x0b; // some other capability, end of list
        assert_eq!(acs(&cfg), Acs::Absent);
        assert!(matches!(acs(&cfg[..64]), Acs::Unreadable(r) if r.contains("root")));
        assert!(matches!(acs(&cfg[..256]), Acs::Unreadable(_)));
        // A list that points at itself ends.
        cfg[0x100..0x104].copy_from_slice(&(0x0001u32 | 0x100 << 20).to_le_bytes());
        assert_eq!(acs(&cfg), Acs::Absent);
    }
}
