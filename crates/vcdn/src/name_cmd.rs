//! `vcdn name`: video chunks ↔ 64-bit ids ↔ IPv6 addresses.

use clap::Subcommand;
use vcdn_content::address::{decode, ContentPrefix};
use vcdn_content::name::{ChunkDuration, ChunkId, ChunkName};

#[derive(Subcommand)]
pub enum NameCmd {
    /// Print the IPv6 address (and id) of a chunk.
    Encode {
        /// The producer's /64, e.g. 2001:db8:1:2::/64.
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        video: u64,
        #[arg(long)]
        chunk: u64,
        #[arg(long)]
        quality: u64,
        /// Chunk duration in seconds, e.g. 2 or 3.84.
        #[arg(long)]
        duration: String,
    },
    /// Print the chunk address of a URL path on a service's chunk prefix
    /// (a service routed with SRv6 without a segment template: the id is
    /// the path's hash, as the player and the caches compute it).
    Path {
        /// The service's chunk /64 (its entry point's `srv6.chunk_prefix`).
        #[arg(long)]
        prefix: String,
        /// e.g. /video/seg-1.m4s
        path: String,
    },
    /// Print the fields of a chunk address (or of a 16-hex-digit id).
    Decode { address: String },
}

pub fn run(cmd: NameCmd) -> Result<(), String> {
    match cmd {
        NameCmd::Encode {
            prefix,
            video,
            chunk,
            quality,
            duration,
        } => {
            let prefix: ContentPrefix = prefix.parse().map_err(|e| format!("--prefix: {e}"))?;
            let d: ChunkDuration = duration.parse().map_err(|e| format!("--duration: {e}"))?;
            let name = ChunkName::new(video, chunk, quality, d).map_err(|e| e.to_string())?;
            println!("{}", prefix.address(name.id()));
            Ok(())
        }
        NameCmd::Path { prefix, path } => {
            let prefix: ContentPrefix = prefix.parse().map_err(|e| format!("--prefix: {e}"))?;
            let id = vcdn_content::content_id(None, &path);
            println!("{}", prefix.address(ChunkId(id)));
            Ok(())
        }
        NameCmd::Decode { address } => {
            if let Ok(ip) = address.parse::<std::net::Ipv6Addr>() {
                let (p, n) = decode(ip);
                println!("{}", vcdn_content::describe(Some(&p), &n).trim_end());
                return Ok(());
            }
            let id: ChunkId = address.parse().map_err(|_| {
                format!("'{address}' is neither an IPv6 address nor a 16-hex-digit chunk id")
            })?;
            println!(
                "{}",
                vcdn_content::describe(None, &ChunkName::from_id(id)).trim_end()
            );
            Ok(())
        }
    }
}
