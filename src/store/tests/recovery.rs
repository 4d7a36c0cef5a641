//! What survives when the process stops at any moment, or is copied while
//! it writes: a writer thread commits numbered batches, and every image of
//! the store, a crash image or a backup, must hold batches 1..=N whole for
//! some N (never part of a batch), N at least the last batch whose commit
//! had returned before the image was taken.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rand::Rng;
use rusqlite::{Connection, OpenFlags};

use super::sqlite_only::private_dir;
use super::*;
use crate::store::sqlite::{self, DB_FILE};

/// Records each batch adds, tagged with its number: the store holds every
/// batch's.
const ADDED_RECORDS: u32 = 20;
/// Records every batch overwrites: after batch N they all say N. With the
/// added ones, 200 records a batch, and a store that grows slowly enough to
/// be read back after every image.
const SHARED_RECORDS: u32 = 180;
/// The writer stops here if the test has not stopped it first.
const MAX_BATCHES: u64 = 5_000;

/// About 300 bytes, naming its batch and record.
fn value(batch: u64, record: u32) -> Vec<u8> {
    let mut value = format!("batch {batch:08} record {record:04} ").into_bytes();
    value.resize(300, b'.');
    value
}

fn receipt_key(batch: u64, record: u32) -> Vec<u8> {
    [batch.to_be_bytes().as_slice(), &record.to_be_bytes()].concat()
}

/// Batch `n`: new receipts, an overwrite of every shared resource (the two
/// interleaved), the previous batch's queue item deleted and its own
/// added, and `last = n`.
fn batch(n: u64) -> Vec<Change> {
    let mut changes = Vec::new();
    let every = SHARED_RECORDS / ADDED_RECORDS;
    for shared in 0..SHARED_RECORDS {
        changes.push(put(
            Kind::Resource,
            &shared.to_be_bytes(),
            &value(n, shared),
        ));
        if shared.is_multiple_of(every) {
            let added = shared / every;
            changes.push(put(Kind::Receipt, &receipt_key(n, added), &value(n, added)));
        }
    }
    if n > 1 {
        changes.push(delete(Kind::QueueItem, &(n - 1).to_be_bytes()));
    }
    changes.push(put(Kind::QueueItem, &n.to_be_bytes(), &value(n, 0)));
    changes.push(put(Kind::Meta, b"last", n.to_string().as_bytes()));
    changes
}

/// The N of a store holding exactly batches 1..=N, or what is wrong.
fn whole_prefix(records: &[Record]) -> Result<u64, String> {
    let last = match records
        .iter()
        .find(|record| record.kind == Kind::Meta && record.key == b"last")
    {
        None => 0,
        Some(record) => std::str::from_utf8(&record.value)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or("meta last is not a number")?,
    };
    let (mut receipts, mut shared, mut queue) = (0u64, 0u32, 0u32);
    for record in records {
        match record.kind {
            Kind::Meta if record.key == b"last" => {}
            Kind::Receipt => {
                let batch = u64::from_be_bytes(record.key[..8].try_into().unwrap());
                let index = u32::from_be_bytes(record.key[8..].try_into().unwrap());
                if batch == 0 || batch > last || record.value != value(batch, index) {
                    return Err(format!(
                        "receipt {index} of batch {batch} in a store at batch {last}"
                    ));
                }
                receipts += 1;
            }
            Kind::Resource => {
                let index = u32::from_be_bytes(record.key[..].try_into().unwrap());
                if record.value != value(last, index) {
                    return Err(format!(
                        "shared record {index} is not batch {last}'s: {:?}",
                        String::from_utf8_lossy(&record.value[..30])
                    ));
                }
                shared += 1;
            }
            Kind::QueueItem if record.key == last.to_be_bytes() => queue += 1,
            _ => return Err(format!("a stray {:?} record", record.kind)),
        }
    }
    let whole = receipts == last * u64::from(ADDED_RECORDS)
        && (last == 0 || (shared == SHARED_RECORDS && queue == 1));
    if !whole {
        return Err(format!(
            "at batch {last}: {receipts} receipts, {shared} shared, {queue} queue items"
        ));
    }
    Ok(last)
}

struct Writer {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
    thread: JoinHandle<SqliteStore>,
}

impl Writer {
    /// Commits batch 1, 2, … on a thread of its own, until stopped.
    fn start(mut store: SqliteStore) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let thread = thread::spawn({
            let (stop, committed) = (stop.clone(), committed.clone());
            move || {
                for n in 1..=MAX_BATCHES {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    store.commit(&batch(n)).unwrap();
                    committed.store(n, Ordering::SeqCst);
                    // Room for the images between commits, so that the
                    // store does not outgrow the test.
                    thread::sleep(Duration::from_millis(10));
                }
                store
            }
        });
        let writer = Writer {
            stop,
            committed,
            thread,
        };
        while writer.committed() < 3 {
            thread::sleep(Duration::from_millis(1));
        }
        writer
    }

    /// The last batch whose commit has returned.
    fn committed(&self) -> u64 {
        self.committed.load(Ordering::SeqCst)
    }

    fn running(&self) -> bool {
        !self.thread.is_finished()
    }

    fn stop(self) -> (SqliteStore, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let store = self.thread.join().unwrap();
        (store, self.committed.load(Ordering::SeqCst))
    }
}

/// Opens the image in `dir` as a store and returns its N.
/// The store at `dir`, its checkpoints as in production (the checkpointer
/// thread beside the writer, the writer's own past a mark) but at marks low
/// enough that they come every few batches.
fn checkpointing_often(dir: &Path) -> SqliteStore {
    SqliteStore::open_checkpointing_at(dir, 64, 256).unwrap()
}

fn recovered(dir: &Path) -> u64 {
    let mut store = SqliteStore::open(dir).unwrap();
    let records = store.load().unwrap();
    whole_prefix(&records).unwrap_or_else(|problem| panic!("{}: {problem}", dir.display()))
}

fn random_pause(rng: &mut impl Rng, max_micros: u64) {
    thread::sleep(Duration::from_micros(rng.random_range(0..max_micros)));
}

#[test]
fn the_batches_check_themselves() {
    let mut memory = MemoryStore::new();
    for n in 1..=3 {
        memory.commit(&batch(n)).unwrap();
        assert_eq!(whole_prefix(&memory.load().unwrap()), Ok(n));
    }
    // Part of batch 4: refused.
    memory.commit(&batch(4)[..100]).unwrap();
    assert!(whole_prefix(&memory.load().unwrap()).is_err());
    let mut memory = MemoryStore::new();
    memory.commit(&batch(1)).unwrap();
    let mut second = batch(2);
    second.retain(|change| change.kind != Kind::Resource);
    memory.commit(&second).unwrap();
    assert!(whole_prefix(&memory.load().unwrap()).is_err());
}

/// The size of a WAL frame: a 24-byte header and a 4096-byte page.
const FRAME: u64 = 24 + 4096;
/// The WAL file's own header.
const WAL_HEADER: u64 = 32;

/// Whether the WAL ends inside a transaction when cut at `len` bytes: the
/// last whole frame before the cut is not a commit frame (its header's
/// database size is 0) or a frame is cut in two.
fn ends_mid_batch(wal: &[u8], len: u64) -> bool {
    if len <= WAL_HEADER {
        return false;
    }
    let frames = (len - WAL_HEADER) / FRAME;
    if !(len - WAL_HEADER).is_multiple_of(FRAME) {
        return true;
    }
    let last = (WAL_HEADER + (frames - 1) * FRAME) as usize;
    wal[last + 4..last + 8] == [0, 0, 0, 0]
}

/// The database and its WAL copied with plain file copies while the writer
/// commits, as a crash would leave them, and from each copy two more: its
/// WAL cut short at a random byte, and with a random stretch of it
/// overwritten, as a crash during a WAL append leaves it. Recovery must
/// drop a half-written batch whole.
///
/// A crash leaves both files as of one instant; two copies one after the
/// other are not, if a checkpoint writes the database between them or a
/// WAL restart overwrites frames the database copy lacks. So a read
/// transaction is held across the two copies: while it lasts a checkpoint
/// writes into the database only frames of its snapshot, which are in the
/// WAL copy too, and the WAL is never restarted, only appended to. The
/// pair is then an image a crash could leave; so is one whose WAL loses or
/// garbles only bytes past the snapshot (the WAL's length when the read
/// began, at or past the snapshot's last frame), which no checkpoint can
/// have copied. Checkpoints are frequent
/// here, so that images fall before, during and after them.
#[test]
fn crash_images_hold_whole_batches() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let store = checkpointing_often(&dir);
    // The WAL cut back at the first commit after each restart, so that its
    // length is where its frames end, not where an older, longer
    // generation ended.
    store
        .connection()
        .pragma_update(None, "journal_size_limit", 0)
        .unwrap();
    let db = dir.join(DB_FILE);
    let wal = dir.join(format!("{DB_FILE}-wal"));
    let writer = Writer::start(store);
    let pin = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut rng = rand::rng();
    let (mut images, mut mid_batch, mut found) = (0, 0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while images < 40 && writer.running() && Instant::now() < deadline {
        random_pause(&mut rng, 3_000);
        let acknowledged = writer.committed();
        pin.execute_batch("BEGIN").unwrap();
        let _: i64 = pin
            .query_row("SELECT count(*) FROM meta", [], |row| row.get(0))
            .unwrap();
        let snapshot = fs::metadata(&wal).unwrap().len();
        let db_image = fs::read(&db).unwrap();
        // Long enough for the writer to append a batch or two meanwhile.
        random_pause(&mut rng, 30_000);
        let wal_image = fs::read(&wal).unwrap();
        pin.execute_batch("COMMIT").unwrap();
        let len = wal_image.len() as u64;
        let cut = rng.random_range(snapshot.min(len)..=len);
        let mut garbled = wal_image.clone();
        let from = rng.random_range(snapshot.min(len)..=len) as usize;
        let to = (from + rng.random_range(1..2 * FRAME as usize)).min(garbled.len());
        rng.fill(&mut garbled[from..to]);
        let variants = [
            ("copy", wal_image.as_slice()),
            ("cut", &wal_image[..cut as usize]),
            ("garbled", garbled.as_slice()),
        ];
        mid_batch += usize::from(ends_mid_batch(&wal_image, len))
            + usize::from(ends_mid_batch(&wal_image, cut))
            + usize::from(from < to && ends_mid_batch(&wal_image, from as u64));
        for (variant, wal_bytes) in variants {
            let image = private_dir(parent.path(), &format!("image{images}-{variant}"));
            fs::write(image.join(DB_FILE), &db_image).unwrap();
            fs::write(image.join(format!("{DB_FILE}-wal")), wal_bytes).unwrap();
            let n = recovered(&image);
            assert!(
                n >= acknowledged,
                "image {images} ({variant}) holds batch {n}, \
                 but batch {acknowledged} had been committed"
            );
            found.push(n);
            fs::remove_dir_all(&image).unwrap();
        }
        images += 1;
    }
    drop(pin);
    let (mut store, last) = writer.stop();
    assert!(
        store.checkpointer_passes() > 0,
        "the checkpointer never ran"
    );
    assert_eq!(whole_prefix(&store.load().unwrap()), Ok(last));
    drop(store);
    assert_eq!(recovered(&dir), last);
    assert_eq!(images, 40, "the writer finished first");
    assert!(mid_batch > 0, "no image ended inside a batch");
    eprintln!(
        "{images} crash images, 3 variants each, {mid_batch} ending inside a batch; \
         batches {found:?}"
    );
}

/// `backup` while the writer commits: every copy opens as a store holding
/// a whole prefix.
#[test]
fn backups_taken_while_writing_hold_whole_batches() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let store = checkpointing_often(&dir);
    let writer = Writer::start(store);
    let mut rng = rand::rng();
    let mut found = Vec::new();
    while found.len() < 10 && writer.running() {
        random_pause(&mut rng, 5_000);
        let acknowledged = writer.committed();
        let file = parent.path().join(format!("backup{}", found.len()));
        let report = sqlite::backup(&dir, &file).unwrap();
        let restored = private_dir(parent.path(), &format!("restored{}", found.len()));
        fs::rename(&file, restored.join(DB_FILE)).unwrap();
        let n = recovered(&restored);
        assert!(
            n >= acknowledged,
            "backup holds {n}, {acknowledged} committed"
        );
        assert_eq!(
            report.records(),
            n * u64::from(ADDED_RECORDS) + u64::from(SHARED_RECORDS) + 2
        );
        fs::remove_dir_all(&restored).unwrap();
        found.push(n);
    }
    let (store, last) = writer.stop();
    assert!(
        store.checkpointer_passes() > 0,
        "the checkpointer never ran"
    );
    assert!(found.len() >= 5, "only {} backups", found.len());
    assert!(found.windows(2).all(|pair| pair[0] <= pair[1]), "{found:?}");
    eprintln!("backups at batches {found:?} of {last}");
}
