//! Where a granted name may lead: the host resolves it itself, and every address it resolves
//! to must be public unless the grant names it (loopback, link-local, private, shared and
//! unspecified ranges, and their IPv6 forms, are told apart here).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use wasmtime_wasi_http::Error as HttpError;

use super::HttpOrigin;

/// The class of an address a granted name may resolve to only with `http_private_hosts`
/// (`"loopback"`, `"link-local"`, `"private"`, ...), or `None` for any other address.
///
/// IPv4: 0.0.0.0/8 (unspecified: Linux connects 0.0.0.0 to the host itself), 127.0.0.0/8,
/// 169.254.0.0/16 (the cloud metadata service 169.254.169.254 among them), 10.0.0.0/8,
/// 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10 (shared, carrier-grade NAT: some clouds' own
/// services live there) and 255.255.255.255. IPv6: `::`, `::1`, fe80::/10, fc00::/7 (unique
/// local), fec0::/10 (the deprecated site-local), and an IPv4 address written as IPv6
/// (`::ffff:a.b.c.d` mapped, `::a.b.c.d` compatible, `64:ff9b::a.b.c.d` NAT64) when that
/// IPv4 address is one of the above.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    match ip.octets() {
        [0, ..] => Some("unspecified"),
        [127, ..] => Some("loopback"),
        [169, 254, ..] => Some("link-local"),
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => Some("private"),
        [100, 64..=127, ..] => Some("shared"),
        [255, 255, 255, 255] => Some("broadcast"),
        _ => None,
    }
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    let segments = ip.segments();
    if let [0, 0, 0, 0, 0, 0xffff | 0, ..] | [0x64, 0xff9b, 0, 0, 0, 0, ..] = segments {
        let [.., a, b, c, d] = ip.octets();
        return non_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    match segments[0] {
        s if s & 0xffc0 == 0xfe80 => Some("link-local"),
        s if s & 0xfe00 == 0xfc00 || s & 0xffc0 == 0xfec0 => Some("private"),
        _ => None,
    }
}

/// Whether a request to `origin` may go to `addresses` (what its host resolved to): each must be
/// public unless the grant names it explicitly, by writing the address itself in `http_hosts`
/// (an IP literal is reached whatever its range) or by listing the origin in
/// `http_private_hosts`. The refusal names the address and both ways to allow it.
pub(super) fn check_addresses(origin: &HttpOrigin, addresses: &[SocketAddr]) -> std::result::Result<(), String> {
    if origin.private_allowed || origin.ip_literal().is_some() {
        return Ok(());
    }
    for address in addresses {
        if let Some(class) = non_public(address.ip()) {
            return Err(format!(
                "{origin}: {} resolves to {} ({class}), and a grant reaches a loopback, link-local or private \
                 address only when it names it explicitly: write the address itself in http_hosts and in the \
                 plugin's URL ({}://{address}), or list {origin} in the grant's http_private_hosts as well as in \
                 http_hosts",
                origin.host,
                address.ip(),
                origin.scheme,
            ));
        }
    }
    Ok(())
}

/// The addresses of `origin`'s host: an IP literal itself, or what the system resolver answers
/// for the name before `deadline` (in its order, each once).
pub(super) async fn resolve(
    origin: &HttpOrigin,
    deadline: tokio::time::Instant,
) -> std::result::Result<Vec<SocketAddr>, HttpError> {
    if let Some(ip) = origin.ip_literal() {
        return Ok(vec![SocketAddr::new(ip, origin.port)]);
    }
    let lookup = tokio::net::lookup_host((origin.host.as_str(), origin.port));
    let found = match tokio::time::timeout_at(deadline, lookup).await {
        Err(_) => return Err(HttpError::DnsTimeout),
        Ok(Err(e)) => {
            return Err(HttpError::DnsError { rcode: Some(format!("{}: {e}", origin.host)), info_code: None });
        }
        Ok(Ok(found)) => found,
    };
    let mut addresses: Vec<SocketAddr> = Vec::new();
    for address in found {
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    if addresses.is_empty() {
        return Err(HttpError::DnsError { rcode: Some(format!("{}: no address", origin.host)), info_code: None });
    }
    Ok(addresses)
}
