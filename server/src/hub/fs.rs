//! Names and files under the cache root: which names a server may give, and creating
//! folders and files only below the root, never through a link that leads out of it.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{shown, MAX_COMPONENT_BYTES, MAX_NAME_BYTES};

/// A repository path that stays inside the folder it is joined to: relative, `/`-separated
/// components, none empty, `.` or `..`, no backslash.
pub(super) fn safe_name(f: &str) -> bool {
    !f.is_empty()
        && !f.starts_with('/')
        && !f.contains('\\')
        && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Why a file name from a listing cannot be used as a path in the cache, if it cannot.
pub(super) fn bad_name(f: &str) -> Option<&'static str> {
    if f.is_empty() {
        Some("is empty")
    } else if f.len() > MAX_NAME_BYTES {
        Some("is longer than 1024 bytes")
    } else if f.chars().any(char::is_control) {
        Some("holds control characters")
    } else if !safe_name(f) || !f.split('/').all(plain_component) {
        Some("is not a relative, normalized path")
    } else if f.split('/').any(|c| c.len() > MAX_COMPONENT_BYTES) {
        Some("has a part longer than 255 bytes")
    } else {
        None
    }
}

/// One plain path component on this system (no root, prefix, `.` or `..`).
pub(super) fn plain_component(c: &str) -> bool {
    let mut parts = Path::new(c).components();
    matches!(parts.next(), Some(Component::Normal(n)) if n == c) && parts.next().is_none()
}

/// `dir/name` for a name already checked, checked again: one plain component.
pub(super) fn child(dir: &Path, name: &str) -> Result<PathBuf> {
    if !plain_component(name) || name.contains('/') || name.contains('\\') {
        bail!("{} is not a plain name; nothing was written", shown(name));
    }
    Ok(dir.join(name))
}

/// `root/parts…`, each folder created where missing, none a link leading out of `root`, and
/// none something other than a folder.
pub(super) fn ensure_dir(root: &Path, parts: &[&str]) -> Result<PathBuf> {
    std::fs::create_dir_all(root)
        .with_context(|| format!("creating the cache folder {}", root.display()))?;
    let real_root = std::fs::canonicalize(root)
        .with_context(|| format!("the cache folder {}", root.display()))?;
    let mut p = root.to_path_buf();
    for part in parts {
        p = child(&p, part)?;
        let mut created = false;
        loop {
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => {
                    let real = std::fs::canonicalize(&p).ok();
                    match real {
                        Some(r) if r.starts_with(&real_root) && r.is_dir() => break,
                        _ => bail!(
                            "{} is a link that leads out of the cache{}; refusing to write through it",
                            p.display(),
                            real.map(|r| format!(" (to {})", r.display()))
                                .unwrap_or_default()
                        ),
                    }
                }
                Ok(m) if m.is_dir() => break,
                Ok(_) => bail!("{} is in the way: it is not a folder", p.display()),
                Err(e) if e.kind() == ErrorKind::NotFound && !created => {
                    created = true;
                    match std::fs::create_dir(&p) {
                        Ok(()) => break,
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                        Err(e) => {
                            return Err(e).with_context(|| format!("creating {}", p.display()))
                        }
                    }
                }
                Err(e) => return Err(e).with_context(|| format!("{}", p.display())),
            }
        }
    }
    Ok(p)
}

/// Removes `p` when it is a link or a plain file (a link is removed, not what it points to).
pub(super) fn remove_entry(p: &Path) -> Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => bail!("{} is in the way: it is a folder", p.display()),
        Ok(_) => std::fs::remove_file(p).with_context(|| format!("removing {}", p.display())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("{}", p.display())),
    }
}

/// A path's file-system entry, without following a link.
pub(super) enum Entry {
    Missing,
    File(u64),
    Link,
    Other,
}

pub(super) fn entry(p: &Path) -> Result<Entry> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_symlink() => Ok(Entry::Link),
        Ok(m) if m.is_file() => Ok(Entry::File(m.len())),
        Ok(_) => Ok(Entry::Other),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Entry::Missing),
        Err(e) => Err(e).with_context(|| format!("{}", p.display())),
    }
}

/// Whether the file at `p` has other names (a hard link: appending to it would change them).
pub(super) fn hard_linked(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).is_ok_and(|m| m.nlink() > 1)
    }
    #[cfg(not(unix))]
    {
        let _ = p;
        false
    }
}

/// A new file at `p` (`O_CREAT|O_EXCL`: never through a link); a link or file there is
/// removed first.
pub(super) fn create_new(p: &Path) -> Result<File> {
    remove_entry(p)?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p)
        .with_context(|| format!("creating {}", p.display()))
}
