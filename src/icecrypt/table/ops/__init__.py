"""Operations: each builds a change of the table (new files and a list of updates) and hands
it to the committer (``write``: create, append, overwrite, delete, expiry, key rotation, on
any branch or staged for WAP; ``refs``: branches, tags, rollback and properties;
``cherry_pick``; ``schema``, ``spec`` and ``sort_order``: evolution)."""
