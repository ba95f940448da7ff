//! Nearest-region fallback for clients outside every coverage zone: a
//! MaxMind GeoIP2/GeoLite2 City database (`.mmdb`) gives the client's
//! coordinates, and the region with the closest coordinates wins.

use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

#[derive(Deserialize)]
struct Record {
    location: Option<Location>,
}

#[derive(Deserialize)]
struct Location {
    latitude: Option<f64>,
    longitude: Option<f64>,
}

/// An opened `.mmdb` database (read whole into memory).
pub struct GeoIp {
    reader: maxminddb::Reader<Vec<u8>>,
}

impl GeoIp {
    pub fn open(path: &Path) -> Result<GeoIp, String> {
        let reader = maxminddb::Reader::open_readfile(path)
            .map_err(|e| format!("cannot open GeoIP database {}: {e}", path.display()))?;
        Ok(GeoIp { reader })
    }

    /// The client's (latitude, longitude) and the prefix length of the
    /// database network that holds it, if the database knows it.
    pub fn locate(&self, ip: IpAddr) -> Option<((f64, f64), u8)> {
        let found = self.reader.lookup(ip).ok()?;
        let rec: Record = found.decode().ok()??;
        let loc = rec.location?;
        let prefix = found.network().ok()?.prefix();
        Some(((loc.latitude?, loc.longitude?), prefix))
    }
}
