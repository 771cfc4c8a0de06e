//! libFuzzer target for the capture file reader: `pcap::read` and its records must return
//! `Ok` or `Err` for any bytes, classic pcap or pcapng, never panic; every record's bytes are
//! decoded as its link type says.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::pcap::{self, LinkType};
use roce::{decode_ethernet_snapped, decode_ip_snapped};

fuzz_target!(|file: &[u8]| {
    let Ok((_, records)) = pcap::read(file) else {
        return;
    };
    for record in records {
        let Ok(record) = record else { break };
        let orig_len = record.orig_len as usize;
        let _ = match record.link {
            LinkType::Raw => decode_ip_snapped(record.data, orig_len),
            _ => decode_ethernet_snapped(record.data, orig_len),
        };
    }
});
