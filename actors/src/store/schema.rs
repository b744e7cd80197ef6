//! The database's schema: every table, index and view of the swarm's SQLite file, as the
//! migrations that made it, in order. The code that reads and writes a table lives with its
//! concern (the store's mailboxes, `store::channels`, `store::bridges`, `permissions`); what
//! the tables are is all here.

/// Migration 4: permission requests and grants.
pub(crate) const PERMISSIONS: &str = "CREATE TABLE permissions (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
        agent          TEXT    NOT NULL,
        capability     TEXT    NOT NULL,
        target         TEXT    NOT NULL,
        reason         TEXT    NOT NULL,
        state          TEXT    NOT NULL,
        verdict        TEXT,
        verdict_reason TEXT,
        decided_by     TEXT,
        created_ms     INTEGER NOT NULL,
        decided_ms     INTEGER,
        expires_ms     INTEGER,
        request_key    BLOB UNIQUE
    );
    CREATE INDEX permissions_agent ON permissions (agent, state);";

/// Migration 5: where each bridge mapping stands, and which platform message each post became.
const BRIDGES: &str = "
    ALTER TABLE channel_messages ADD COLUMN origin TEXT;
    CREATE UNIQUE INDEX channel_messages_origin ON channel_messages (origin)
        WHERE origin IS NOT NULL;
    CREATE TABLE bridge_cursors (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        channel TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (bridge, external)
    );
    CREATE TABLE bridge_messages (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        seq INTEGER NOT NULL,
        external_id TEXT NOT NULL,
        PRIMARY KEY (bridge, external, seq)
    );";

/// Migration 6: when a mapping mirrored its channel's archive to its chat.
const BRIDGE_ARCHIVE: &str = "ALTER TABLE bridge_cursors ADD COLUMN archived_at INTEGER;";

/// Migration 7: people's edits and deletions followed. A post keeps its current text (a
/// deleted one keeps none); `channel_edits` is the log of changes each mapping works through
/// after its own `edit_id` cursor; `channel_posts` is a channel's messages as readers see them.
const BRIDGE_EDITS: &str = "
    ALTER TABLE channel_messages ADD COLUMN edited_at INTEGER;
    ALTER TABLE channel_messages ADD COLUMN deleted_at INTEGER;
    CREATE TABLE channel_edits (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        seq INTEGER NOT NULL,
        origin TEXT NOT NULL,
        at INTEGER NOT NULL
    );
    CREATE INDEX channel_edits_by_channel ON channel_edits (channel, id);
    ALTER TABLE bridge_cursors ADD COLUMN edit_id INTEGER NOT NULL DEFAULT 0;
    CREATE VIEW channel_posts AS
        SELECT channel, seq, author, created_at,
               CASE WHEN deleted_at IS NOT NULL THEN '(deleted by its author)'
                    WHEN edited_at IS NOT NULL THEN text || ' (edited)'
                    ELSE text END AS text
        FROM channel_messages;";

/// Migration 8: mappings changed at run time (`flockctl bridge map|unmap`), over the swarm
/// file's: `flock` NULL means the chat is unmapped.
const BRIDGE_MAPPINGS: &str = "
    CREATE TABLE bridge_mappings (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        flock TEXT,
        allow TEXT,
        changed_by TEXT NOT NULL,
        at INTEGER NOT NULL,
        PRIMARY KEY (bridge, external)
    );";

/// Migration 9: the chat door (issue #21). `reply_to`: the seq of the person's post a chain's
/// answer replies to (bridges show it as a reply); `addressed_to`: the agent a person's post was
/// handed to as a durable message (it is not also in that agent's deltas).
const CHAT_DOOR: &str = "
    ALTER TABLE channel_messages ADD COLUMN reply_to INTEGER;
    ALTER TABLE channel_messages ADD COLUMN addressed_to TEXT;
    DROP VIEW channel_posts;
    CREATE VIEW channel_posts AS
        SELECT channel, seq, author, created_at, reply_to, addressed_to,
               CASE WHEN deleted_at IS NOT NULL THEN '(deleted by its author)'
                    WHEN edited_at IS NOT NULL THEN text || ' (edited)'
                    ELSE text END AS text
        FROM channel_messages;";

/// Versioned migrations; `PRAGMA user_version` records how many ran. Append only.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: durable mailboxes and per-agent counters.
    "CREATE TABLE messages (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        id          BLOB    NOT NULL UNIQUE,
        sender      TEXT    NOT NULL,
        target      TEXT    NOT NULL,
        text        TEXT    NOT NULL,
        state       INTEGER NOT NULL DEFAULT 0, -- 0 pending, 1 done, 2 dead
        attempts    INTEGER NOT NULL DEFAULT 0,
        enqueued_at INTEGER NOT NULL,
        finished_at INTEGER,
        reason      TEXT
    );
    CREATE INDEX messages_pending ON messages (target, seq) WHERE state = 0;
    CREATE INDEX messages_dead ON messages (seq) WHERE state = 2;
    CREATE TABLE agent_stats (
        name        TEXT PRIMARY KEY,
        turns_total INTEGER NOT NULL DEFAULT 0
    );",
    // 2: channels (DESIGN.md §8): channels, members as a table, messages keyed (channel, seq),
    // per-(agent, channel) delta cursors, agent states, A2A cards, archive readiness.
    "CREATE TABLE channels (
        id                   TEXT PRIMARY KEY,
        name                 TEXT    NOT NULL,
        topic                TEXT    NOT NULL DEFAULT '',
        created_by           TEXT    NOT NULL,
        created_at           INTEGER NOT NULL,
        state                TEXT    NOT NULL DEFAULT 'active',
        last_seq             INTEGER NOT NULL DEFAULT 0,
        is_dm                INTEGER NOT NULL DEFAULT 0,
        archiving_started_at INTEGER,
        archive_deadline_at  INTEGER,
        archived_at          INTEGER
    );
    CREATE TABLE channel_members (
        channel  TEXT    NOT NULL REFERENCES channels (id),
        member   TEXT    NOT NULL,
        added_at INTEGER NOT NULL,
        PRIMARY KEY (channel, member)
    ) WITHOUT ROWID;
    CREATE INDEX channel_members_by_member ON channel_members (member);
    CREATE TABLE channel_messages (
        channel    TEXT    NOT NULL REFERENCES channels (id),
        seq        INTEGER NOT NULL,
        author     TEXT    NOT NULL,
        text       TEXT    NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (channel, seq)
    ) WITHOUT ROWID;
    CREATE TABLE cursors (
        agent         TEXT    NOT NULL,
        channel       TEXT    NOT NULL,
        sent_seq      INTEGER NOT NULL DEFAULT 0,
        scheduled_seq INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (agent, channel)
    ) WITHOUT ROWID;
    CREATE TABLE agent_states (
        agent TEXT PRIMARY KEY,
        state TEXT NOT NULL
    );
    CREATE TABLE cards (
        agent       TEXT PRIMARY KEY,
        description TEXT    NOT NULL DEFAULT '',
        skills      TEXT    NOT NULL DEFAULT '[]',
        tags        TEXT    NOT NULL DEFAULT '[]',
        updated_at  INTEGER NOT NULL
    );
    CREATE TABLE archive_ready (
        channel TEXT    NOT NULL,
        agent   TEXT    NOT NULL,
        at      INTEGER NOT NULL,
        PRIMARY KEY (channel, agent)
    ) WITHOUT ROWID;
    ALTER TABLE agent_stats ADD COLUMN tokens_in INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE agent_stats ADD COLUMN tokens_out INTEGER NOT NULL DEFAULT 0;
    -- Per-(agent, channel) conversation sessions; channel '' holds direct messages and requests.
    CREATE TABLE session_messages (
        agent      TEXT    NOT NULL,
        channel    TEXT    NOT NULL,
        seq        INTEGER NOT NULL,
        message    TEXT    NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (agent, channel, seq)
    ) WITHOUT ROWID;
    CREATE TABLE sessions_closed (
        agent     TEXT    NOT NULL,
        channel   TEXT    NOT NULL,
        closed_at INTEGER NOT NULL,
        PRIMARY KEY (agent, channel)
    ) WITHOUT ROWID;
    -- Agents created at run time (spec kept), and decommissioned ones (history kept).
    CREATE TABLE agents_registry (
        name              TEXT PRIMARY KEY,
        spec_json         TEXT,
        created_by        TEXT,
        created_at        INTEGER NOT NULL,
        decommissioned_at INTEGER
    );",
    // 3: chains of turns (issue #8). `route` is the router's routing record of a message (JSON:
    // who waits for the answer, the chain it belongs to, its hop); '' means "starts its own
    // chain, nobody waits". A channel post that answers a chain names it in `answers`, unique:
    // a chain's answer is posted once, whatever crashes and replays happen around it.
    "ALTER TABLE messages ADD COLUMN route TEXT NOT NULL DEFAULT '';
    ALTER TABLE channel_messages ADD COLUMN answers BLOB;
    CREATE UNIQUE INDEX channel_messages_answers ON channel_messages (answers)
        WHERE answers IS NOT NULL;",
    // 4: permission requests and grants (issue #11).
    PERMISSIONS,
    // 5: chat bridges (issue #9): the origin of a person's post on a platform (unique: posted
    // once), each mapping's cursor, the platform id of each post it delivered.
    BRIDGES,
    // 6: bridges (issue #9): when a mapping mirrored its channel's archive to its chat.
    BRIDGE_ARCHIVE,
    // 7: bridges (issue #9): people's edits and deletions, the change log each mapping follows,
    // and `channel_posts`, the messages as readers see them.
    BRIDGE_EDITS,
    // 8: bridges (issue #9): mappings made or removed at run time (`flockctl bridge map|unmap`).
    BRIDGE_MAPPINGS,
    // 9: the chat door (issue #21): the post an answer replies to, and the agent a person's
    // post was handed to as a request.
    CHAT_DOOR,
    // 10: hosts (issue #26): how far each agent here was told each channel the leader holds on
    // another host. `born` is the channel's created_at on the leader: a channel made again under
    // the same name starts over.
    "CREATE TABLE deltas_told (
        agent   TEXT    NOT NULL,
        channel TEXT    NOT NULL,
        born    INTEGER NOT NULL,
        upto    INTEGER NOT NULL,
        PRIMARY KEY (agent, channel)
    ) WITHOUT ROWID;",
];
