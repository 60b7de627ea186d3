//! Storage tests: files, metadata, task files and the directory lifecycle together.

use super::*;

fn task_file(id: u64, task: usize) -> FileIdentity {
    FileIdentity::new(FileKind::TaskState, "0123456789abcdef", id, Some(task))
}

#[test]
fn files_round_trip_and_damage_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let digest = write_file(&path, &task_file(4, 2), &payload).unwrap();
    assert_eq!(read_file(&path, FileKind::TaskState).unwrap(), (task_file(4, 2), payload.clone()));
    assert_eq!(read_expected(&path, &task_file(4, 2), Some(&digest)).unwrap(), payload);
    assert!(read_file(&path, FileKind::Metadata).is_err(), "wrong kind");
    let good = std::fs::read(&path).unwrap();
    assert_eq!(FileDigest::of(&good), digest);
    // Truncations and every kind of flipped byte are caught.
    for cut in [0, 3, 15, 16, 47, 48, 100, 65_000, good.len() - 8, good.len() - 1] {
        assert!(decode_file(&good[..cut], FileKind::TaskState).is_err(), "cut at {cut}");
    }
    for at in [0, 5, 9, 13, 17, 25, 41, 45, 48, 52, 60, 70_000, good.len() - 3] {
        let mut bad = good.clone();
        bad[at] ^= 0x40;
        assert!(decode_file(&bad, FileKind::TaskState).is_err(), "flip at {at}");
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(decode_file(&longer, FileKind::TaskState).is_err());
}

/// A file that verifies but was written for another task, checkpoint or job is refused,
/// naming what it is and what belongs there; so is one whose length or checksum is not
/// what was recorded for it.
#[test]
fn files_that_belong_elsewhere_are_misplaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let digest = write_file(&path, &task_file(4, 2), b"state").unwrap();
    for (expected, what) in [
        (task_file(4, 0), "task 2"),
        (task_file(3, 2), "checkpoint 4"),
        (FileIdentity::new(FileKind::TaskState, "fedcba9876543210", 4, Some(2)), "job 0123456789abcdef"),
    ] {
        let err = read_expected(&path, &expected, None).unwrap_err().to_string();
        assert!(err.contains("misplaced") && err.contains(what) && err.contains("f:"), "{err}");
    }
    let other = FileDigest { bytes: digest.bytes, crc32c: digest.crc32c ^ 1 };
    let err = read_expected(&path, &task_file(4, 2), Some(&other)).unwrap_err().to_string();
    assert!(err.contains("whole-file checksum"), "{err}");
    let shorter = FileDigest { bytes: digest.bytes - 1, ..digest };
    assert!(read_expected(&path, &task_file(4, 2), Some(&shorter)).unwrap_err().to_string().contains("bytes"));
}

/// A checkpoint that reused a failed one's part refers to shared pages no completed
/// checkpoint verified: read back whole, a flipped bit in them fails verification, which
/// the length alone (enough for pages a completed checkpoint verified) does not see.
#[test]
fn shared_pages_of_a_failed_checkpoint_are_verified_whole_when_first_reused() {
    let dir = tempfile::tempdir().unwrap();
    let s = CheckpointStorage::new(dir.path());
    let mut w = s.create_shared(1, 0).unwrap();
    w.write(&[7u8; 5000]).unwrap();
    let shared = SharedFile::new(CheckpointStorage::shared_name(1, 0), w.finish().unwrap());
    s.prepare(2).unwrap();
    let parts = TaskFileContent::inline(vec![("op".into(), 0, vec![2; 10])]);
    let (file, digest) = s.write_task(2, 0, &parts).unwrap();
    s.commit(&test_metadata(2, file, digest, vec![shared.clone()])).unwrap();
    let whole: HashSet<String> = [shared.file.clone()].into();
    s.verify_including(2, &whole).unwrap();
    let path = dir.path().join(&shared.file);
    let mut b = std::fs::read(&path).unwrap();
    b[3000] ^= 1;
    std::fs::write(&path, b).unwrap();
    assert!(s.verify(2).is_ok(), "its length is unchanged");
    let err = s.verify_including(2, &whole).unwrap_err().to_string();
    assert!(err.contains("chk-1-task-0.pages"), "{err}");
}

#[test]
fn checkpoints_commit_load_and_fall_back_past_damage() {
    let dir = tempfile::tempdir().unwrap();
    let s = CheckpointStorage::new(dir.path());
    for id in 1..=3u64 {
        s.prepare(id).unwrap();
        let parts = TaskFileContent::inline(vec![("op".into(), 0, vec![id as u8; 10])]);
        let (file, digest) = s.write_task(id, 0, &parts).unwrap();
        s.commit(&test_metadata(id, file, digest, Vec::new())).unwrap();
        assert!(s.verify(id).is_ok());
    }
    s.prepare(4).unwrap(); // never completed
    let found = s.latest_valid().unwrap();
    assert_eq!(found.checkpoint.unwrap().state.get("op", 0), Some(&[3u8; 10][..]));
    assert!(found.skipped.is_empty());
    // Damage checkpoint 3's task file: recovery falls back to 2 and says why.
    let f = s.checkpoint_dir(3).join("task-0.state");
    let mut b = std::fs::read(&f).unwrap();
    b[60] ^= 1;
    std::fs::write(&f, b).unwrap();
    assert!(s.verify(3).is_err());
    let found = s.latest_valid().unwrap();
    assert_eq!(found.checkpoint.unwrap().metadata.checkpoint, 2);
    assert_eq!(found.skipped.len(), 1);
    assert!(found.skipped[0].0 == 3 && found.skipped[0].1.contains("checksum"), "{:?}", found.skipped);
    // Checkpoint 2's file where checkpoint 1's belongs: misplaced.
    std::fs::copy(s.checkpoint_dir(2).join("task-0.state"), s.checkpoint_dir(1).join("task-0.state")).unwrap();
    let err = s.load(1).unwrap_err().to_string();
    assert!(err.contains("chk-1") && err.contains("task-0.state"), "{err}");
    let mut completed = vec![1, 2, 3];
    assert!(s.retain(&mut completed, 1, &HashSet::new()).is_empty());
    assert_eq!(completed, vec![3]);
    assert_eq!(s.list(), vec![3, 4]);
}

/// A file that cannot be read is not damage: recovery stops with the I/O error instead of
/// falling back past the checkpoint.
#[test]
fn an_unreadable_file_stops_recovery_and_is_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let s = CheckpointStorage::new(dir.path());
    for id in 1..=2u64 {
        s.prepare(id).unwrap();
        let (file, digest) = s.write_task(id, 0, &TaskFileContent::inline(vec![("op".into(), 0, vec![1])])).unwrap();
        s.commit(&test_metadata(id, file, digest, Vec::new())).unwrap();
    }
    // A symbolic link to itself: open(2) fails (ELOOP), as it would with EACCES or EIO.
    let f = s.checkpoint_dir(2).join("task-0.state");
    std::fs::rename(&f, dir.path().join("aside")).unwrap();
    std::os::unix::fs::symlink(&f, &f).unwrap();
    let err = s.latest_valid().unwrap_err();
    assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("task-0.state"), "{err}");
    std::fs::remove_file(&f).unwrap();
    std::fs::rename(dir.path().join("aside"), &f).unwrap();
    assert_eq!(s.latest_valid().unwrap().checkpoint.unwrap().metadata.checkpoint, 2);
}
