"""Trial output on an object store (`s3://...`, any pyarrow.fs URI) instead of a shared path.

Every process keeps a local working copy of the trial directory, because everything that writes
trial files relies on POSIX (atomic renames, fsync, appends); what a process writes is pushed
to the bucket and what others wrote is pulled from it (`mirror.Mirror`). Who owns which files,
and when each side syncs, is in `trial_storage`; weight versions travel separately
(`remote_weights`), uploaded before the learner announces them.
"""
