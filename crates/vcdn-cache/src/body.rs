//! Object bodies. Large ones live in sealed shared-memory files (memfd), so
//! a hit can be sent with `sendfile(2)`: the kernel takes the pages as they
//! are instead of copying the body from user space for every client. This
//! is what SHFS's block cache gives MiniCache and what the page cache gives
//! nginx; the same bytes are also mapped into memory, so ranges, the disk
//! tier and the admin API read them as an ordinary `Bytes`.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};

/// Bodies from this size on go to shared memory; smaller ones are copied
/// into the response batch anyway.
pub const SHM_MIN: usize = 64 * 1024;

/// A body, and the file holding it when it is in shared memory.
#[derive(Debug, Clone)]
pub struct Body {
    pub bytes: Bytes,
    pub file: Option<Arc<File>>,
}

impl Body {
    pub fn heap(bytes: Bytes) -> Body {
        Body { bytes, file: None }
    }

    /// Assemble received chunks into one body: in shared memory when large
    /// (falling back to the heap if no memfd can be had, e.g. out of file
    /// descriptors), else on the heap.
    pub fn assemble(chunks: &[Bytes]) -> Body {
        let len: usize = chunks.iter().map(Bytes::len).sum();
        if len >= SHM_MIN {
            match shm(chunks) {
                Ok(b) => return b,
                Err(e) => tracing::debug!(error = %e, "memfd unavailable, body kept on the heap"),
            }
        }
        match chunks {
            [] => Body::heap(Bytes::new()),
            [one] => Body::heap(one.clone()),
            _ => {
                let mut b = BytesMut::with_capacity(len);
                for c in chunks {
                    b.extend_from_slice(c);
                }
                Body::heap(b.freeze())
            }
        }
    }
}

impl Body {
    /// A copy in memory of `len` bytes of `from` at `offset` (a disk-tier
    /// file promoted to the memory tier): in shared memory when large,
    /// copied by the kernel, never through a buffer of the object's size.
    pub fn copy_of(from: &File, offset: u64, len: u64) -> std::io::Result<Body> {
        if (len as usize) < SHM_MIN {
            let mut b = vec![0u8; len as usize];
            std::os::unix::fs::FileExt::read_exact_at(from, &mut b, offset)?;
            return Ok(Body::heap(Bytes::from(b)));
        }
        let file = memfd()?;
        let mut off = offset;
        let end = offset + len;
        while off < end {
            let want = (end - off).min(1 << 30) as usize;
            if rustix::fs::sendfile(&file, from, Some(&mut off), want)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        seal(Arc::new(file))
    }
}

/// A new shared-memory file, to be filled and then [`seal`]ed.
pub fn memfd() -> std::io::Result<File> {
    let fd = memfd_create(
        "vcdn-object",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    Ok(File::from(fd))
}

fn shm(chunks: &[Bytes]) -> std::io::Result<Body> {
    let mut file = memfd()?;
    for c in chunks {
        file.write_all(c)?;
    }
    seal(Arc::new(file))
}

/// Seal a filled shared-memory file and map it as a body.
pub fn seal(file: Arc<File>) -> std::io::Result<Body> {
    // Sealed against any change of size, which keeps the mapping valid.
    // Not against writes: F_SEAL_WRITE waits for, then fails on, pages
    // still referenced elsewhere, and a body written as it arrived has had
    // pages sent with sendfile that sit in socket buffers. Nothing writes
    // to it after this point (the writer is done; the mapping is read-only).
    fcntl_add_seals(
        &*file,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    // SAFETY: the file is a memfd of ours whose size can no longer change,
    // so the mapping stays valid; its contents are no longer written.
    let map = unsafe { memmap2::Mmap::map(&*file)? };
    Ok(Body {
        bytes: Bytes::from_owner(map),
        file: Some(file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_bodies_go_to_shared_memory() {
        let chunks: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 40_000])).collect();
        let b = Body::assemble(&chunks);
        assert!(b.file.is_some());
        assert_eq!(b.bytes.len(), 120_000);
        assert_eq!(b.bytes[39_999], 0);
        assert_eq!(b.bytes[40_000], 1);
        assert_eq!(b.file.unwrap().metadata().unwrap().len(), 120_000);
        let small = Body::assemble(&[Bytes::from_static(b"ab"), Bytes::from_static(b"c")]);
        assert!(small.file.is_none());
        assert_eq!(&small.bytes[..], b"abc");
    }
}
