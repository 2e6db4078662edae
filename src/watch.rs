//! Noticing a change of the config file. The file's directory is watched, and not only the
//! file: editors and config managers replace files (a new file renamed over the old one), which
//! a watch on the file itself would lose. The file is watched too (through a symlink, the file
//! it points to), for the changes its directory does not see: a write through another path to
//! the same file, as a Docker bind mount's host edits it (`-v $PWD/proxy.yaml:/etc/...`), or to
//! the file a symlink in another directory points to. Its watch is made again after each change
//! (a file renamed over it is another file).
//!
//! On Linux the watch asks inotify only for the events that end a change — a file written and
//! closed, moved in, created or deleted, or its attributes changed (`chmod`, `touch`) — and not
//! for every `write(2)` (`IN_MODIFY`) or open (so a writer that keeps the file open is seen
//! when it closes it). A log appended next to the config, as with
//! `tollgate --config proxy.yaml 2>> tollgate.log` and the access log on, would otherwise wake
//! the watcher once per line: a thread wake-up per request, which costs the proxy throughput.
//!
//! The module uses nothing else of the crate: `app::Reloader` hands it a channel to tell.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc::Sender;

/// Keeps the watch alive; dropping it stops the watch.
#[cfg(target_os = "linux")]
pub(crate) type Guard = tokio_util::task::AbortOnDropHandle<()>;
#[cfg(not(target_os = "linux"))]
pub(crate) type Guard = notify::RecommendedWatcher;

/// The name Kubernetes gives the symlink through which a mounted ConfigMap's files point
/// (`proxy.yaml -> ..data/proxy.yaml`): an update renames a new `..data` over the old one, and
/// the file's own name is in no event.
const KUBERNETES_DATA: &str = "..data";

/// Whether an event about `file` (a name in the watched directory) may change the config
/// named `name`: the file itself, or the Kubernetes `..data` link it may point through.
fn concerns(file: &std::ffi::OsStr, name: &std::ffi::OsStr) -> bool {
    file == name || file == KUBERNETES_DATA
}

/// The directory to watch and the file's name in it.
fn split(path: &Path) -> Option<(PathBuf, OsString)> {
    let name = path.file_name()?.to_owned();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Some((dir, name))
}

/// Sends on `tx` (without waiting: a full channel already holds a change) whenever the file at
/// `path` may have changed. `None`, with a warning logged, when the directory cannot be watched
/// (SIGHUP still reloads).
#[cfg(target_os = "linux")]
pub(crate) fn watch_file(path: &Path, tx: Sender<()>) -> Option<Guard> {
    let mut watch = match Watch::new(path) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "cannot watch the config file's directory; reload with SIGHUP");
            return None;
        }
    };
    let task = tokio::spawn(async move {
        loop {
            match watch.changed().await {
                Ok(()) => {
                    let _ = tx.try_send(());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "config file watch ended; reload with SIGHUP");
                    return;
                }
            }
        }
    });
    Some(tokio_util::task::AbortOnDropHandle::new(task))
}

/// An inotify watch of the config file's directory, read on the runtime (no thread of its own).
#[cfg(target_os = "linux")]
pub(crate) struct Watch {
    fd: tokio::io::unix::AsyncFd<inotify::Inotify>,
    /// the config file's path, watched itself too
    path: PathBuf,
    /// the directory's watch (every other is of the file, this one or one before it)
    dir: inotify::WatchDescriptor,
    name: OsString,
    buf: Box<[u8]>,
    /// events read so far, of any file in the directory (what the tests count)
    events: u64,
    /// the directory went away (its last events may have come with a change, told first)
    gone: bool,
}

#[cfg(target_os = "linux")]
impl Watch {
    pub(crate) fn new(path: &Path) -> std::io::Result<Watch> {
        use inotify::WatchMask;
        let (dir, name) = split(path).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path")
        })?;
        let inotify = inotify::Inotify::init()?;
        // the events that end a change; not MODIFY (one per write) nor OPEN
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::ATTRIB
            | WatchMask::ONLYDIR;
        let dir = inotify.watches().add(&dir, mask)?;
        use tokio::io::{unix::AsyncFd, Interest};
        // SAFETY: `Inotify` owns its descriptor (shared only with its `Watches` handles, closed
        // when the last of them is dropped, never replaced), so it stays open and the same for
        // as long as the `AsyncFd` holds it.
        let fd = unsafe { AsyncFd::register_with_interest(inotify, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let mut watch = Watch {
            fd,
            path: path.to_path_buf(),
            dir,
            name,
            buf: vec![0; 4096].into_boxed_slice(),
            events: 0,
            gone: false,
        };
        watch.watch_file();
        Ok(watch)
    }

    /// Makes the watch of the file itself, or makes it again. For a symlink, that is the file it
    /// points to. The watch fires when the file is written and closed, when its attributes
    /// change, and when it is moved or deleted.
    fn watch_file(&mut self) {
        use inotify::WatchMask;
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::ATTRIB
            | WatchMask::MOVE_SELF
            | WatchMask::DELETE_SELF;
        // (none while it does not exist; the directory's watch sees it come back)
        let _ = self.fd.get_ref().watches().add(&self.path, mask);
    }

    /// Returns once an event names the file (or the Kubernetes `..data` link, or the kernel's
    /// queue overflowed, which may have lost one). An error when the directory itself went
    /// away: no event can come after that.
    pub(crate) async fn changed(&mut self) -> std::io::Result<()> {
        use inotify::EventMask;
        // the file told last time may be another now (renamed over, or a symlink re-pointed)
        self.watch_file();
        let Watch {
            fd,
            dir,
            name,
            buf,
            events,
            gone,
            ..
        } = self;
        loop {
            if *gone {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the config file's directory was removed",
                ));
            }
            let mut ready = fd.readable_mut().await?;
            let read = ready.try_io(|inotify| {
                let mut hit = false;
                for event in inotify.get_mut().read_events(buf)? {
                    *events += 1;
                    // (a watch of the file, this one or one before it: the file's watch ends
                    // when it is deleted, and is made again above)
                    let of_file = event.wd != *dir;
                    hit |= event.mask.contains(EventMask::Q_OVERFLOW)
                        || (of_file && !event.mask.contains(EventMask::IGNORED))
                        || event.name.is_some_and(|n| concerns(n, name));
                    *gone |= event.wd == *dir && event.mask.contains(EventMask::IGNORED);
                }
                Ok(hit)
            });
            match read {
                Ok(Ok(true)) => return Ok(()),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn events(&self) -> u64 {
        self.events
    }
}

/// Elsewhere, the `notify` crate's watcher of the directory, filtered by name.
#[cfg(not(target_os = "linux"))]
pub(crate) fn watch_file(path: &Path, tx: Sender<()>) -> Option<Guard> {
    use notify::{RecursiveMode, Watcher};
    let (dir, name) = split(path)?;
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        if event
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| concerns(n, &name)))
        {
            let _ = tx.try_send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the config file; reload with SIGHUP");
            return None;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the config directory; reload with SIGHUP");
        return None;
    }
    Some(watcher)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::Watch;
    use std::io::Write;
    use std::time::Duration;

    /// Long enough for an event already queued to be read; a change is awaited far longer.
    const QUIET: Duration = Duration::from_millis(300);
    const CHANGE: Duration = Duration::from_secs(10);

    /// `proxy.yaml` written in `dir`, and a watch of it.
    fn watched(dir: &std::path::Path) -> (std::path::PathBuf, Watch) {
        let config = dir.join("proxy.yaml");
        std::fs::write(&config, "a: 1\n").unwrap();
        let watch = Watch::new(&config).unwrap();
        (config, watch)
    }

    /// Whether no change is told within [`QUIET`].
    async fn quiet(watch: &mut Watch) -> bool {
        tokio::time::timeout(QUIET, watch.changed()).await.is_err()
    }

    /// Waits for a change to be told (up to [`CHANGE`]), naming `what` if none is.
    async fn seen(watch: &mut Watch, what: &str) {
        tokio::time::timeout(CHANGE, watch.changed())
            .await
            .unwrap_or_else(|_| panic!("{what} not seen"))
            .unwrap();
    }

    #[tokio::test]
    async fn a_log_appended_beside_the_config_never_wakes_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = std::fs::File::create(dir.path().join("tollgate.log")).unwrap();
        let (_, mut watch) = watched(dir.path());
        for i in 0..100 {
            writeln!(log, "access line {i}").unwrap();
            log.flush().unwrap();
            // give the watch a chance to read between writes (the kernel joins unread twins)
            assert!(
                tokio::time::timeout(Duration::from_millis(2), watch.changed())
                    .await
                    .is_err()
            );
        }
        assert!(quiet(&mut watch).await);
        assert_eq!(watch.events(), 0, "the appends were seen as events");
    }

    #[tokio::test]
    async fn the_config_written_in_place_or_renamed_over_is_seen_and_neighbours_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (config, mut watch) = watched(dir.path());

        // a neighbour written and closed is an event, not a change of the config
        std::fs::write(dir.path().join("other.yaml"), "b: 2\n").unwrap();
        assert!(quiet(&mut watch).await);
        assert!(watch.events() > 0);

        std::fs::write(&config, "a: 2\n").unwrap();
        seen(&mut watch, "an in-place write").await;

        // an editor's way: a new file (a neighbour until renamed) moved over the config
        let tmp = dir.path().join(".proxy.yaml.tmp");
        std::fs::write(&tmp, "a: 3\n").unwrap();
        assert!(quiet(&mut watch).await);
        std::fs::rename(&tmp, &config).unwrap();
        seen(&mut watch, "a rename over the file").await;
    }

    #[tokio::test]
    async fn a_change_of_mode_and_a_kubernetes_configmap_update_are_seen() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let (config, mut watch) = watched(dir.path());
        // chmod (say, a file a reload found unreadable made readable)
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
        seen(&mut watch, "a chmod").await;

        // a ConfigMap volume: proxy.yaml -> ..data/proxy.yaml, ..data -> ..<version>; an update
        // writes a new version directory and renames a new ..data link over the old one
        let k8s = tempfile::tempdir().unwrap();
        let v1 = k8s.path().join("..2026_12_04_1");
        std::fs::create_dir(&v1).unwrap();
        std::fs::write(v1.join("proxy.yaml"), "a: 1\n").unwrap();
        symlink("..2026_12_04_1", k8s.path().join("..data")).unwrap();
        symlink("..data/proxy.yaml", k8s.path().join("proxy.yaml")).unwrap();
        let mut watch = Watch::new(&k8s.path().join("proxy.yaml")).unwrap();
        let v2 = k8s.path().join("..2026_12_04_2");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("proxy.yaml"), "a: 2\n").unwrap();
        symlink("..2026_12_04_2", k8s.path().join("..data_tmp")).unwrap();
        assert!(quiet(&mut watch).await);
        std::fs::rename(k8s.path().join("..data_tmp"), k8s.path().join("..data")).unwrap();
        seen(&mut watch, "a ConfigMap update").await;
    }

    /// A write to the file through another path — a Docker bind mount edited on the host, a
    /// symlink into another directory — is seen through the file's own watch, also after the
    /// file it points to was replaced.
    #[tokio::test]
    async fn writes_through_another_path_are_seen() {
        use std::os::unix::fs::symlink;
        let real = tempfile::tempdir().unwrap();
        let target = real.path().join("real.yaml");
        std::fs::write(&target, "a: 1\n").unwrap();
        let links = tempfile::tempdir().unwrap();
        let config = links.path().join("proxy.yaml");
        symlink(&target, &config).unwrap();
        let mut watch = Watch::new(&config).unwrap();
        // written in place (as `cp` does, and a bind mount's host side: the same file)
        std::fs::write(&target, "a: 2\n").unwrap();
        seen(&mut watch, "a write to the file the link points to").await;
        // replaced (as `sed -i` does), then written again: the new file is watched
        let tmp = real.path().join("real.yaml.tmp");
        std::fs::write(&tmp, "a: 3\n").unwrap();
        std::fs::rename(&tmp, &target).unwrap();
        seen(&mut watch, "the file replaced").await;
        while !quiet(&mut watch).await {}
        std::fs::write(&target, "a: 4\n").unwrap();
        seen(&mut watch, "a write to the new file").await;
    }

    #[tokio::test]
    async fn the_directory_removed_ends_the_watch_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("conf");
        std::fs::create_dir(&sub).unwrap();
        let (_, mut watch) = watched(&sub);
        // the file's deletion and the watch's end may come in one read: the change is told,
        // then the end
        std::fs::remove_dir_all(&sub).unwrap();
        seen(&mut watch, "the deletion").await;
        let ended = tokio::time::timeout(CHANGE, watch.changed())
            .await
            .expect("the removal not seen");
        assert!(ended.is_err(), "{ended:?}");
    }
}
