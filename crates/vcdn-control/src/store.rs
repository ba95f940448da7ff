//! The persistent store: SQLite in the data directory by default,
//! PostgreSQL when a URL is given. Resources are JSON documents by kind and
//! id (the API's own shapes, so both engines hold the same thing); events
//! are an append-only table.
//!
//! A store knows who it is: an install id written when it is created (the
//! `meta` table) and kept in the data directory (`store-id`). Every
//! operation checks that the database is still the one opened (SQLite: the
//! file's device and inode; both: the install id), so a store removed or
//! replaced while `vcdn up` runs is reported and never written to, and a
//! data directory whose store went missing does not start afresh unless
//! the operator says so.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::Event;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("stored {0} {1} is not valid: {2}")]
    Corrupt(String, String, serde_json::Error),
    /// The store is not the one opened any more; nothing is written to it.
    #[error("the store is unavailable: {0}; restart vcdn up once it is restored (see --reinitialise-store)")]
    Lost(String),
    /// Opening it would silently start afresh.
    #[error("{0}")]
    Refused(String),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

impl StoreError {
    /// Whether the store was removed or replaced under the control plane.
    pub fn is_lost(&self) -> bool {
        matches!(self, StoreError::Lost(_))
    }
}

enum Db {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(tokio_postgres::Client),
}

pub struct Store {
    db: Db,
    /// Written when the store was created; checked on every operation.
    install_id: String,
    /// SQLite: the database file and its (device, inode) when opened.
    file: Option<(PathBuf, (u64, u64))>,
    /// Why the store cannot be trusted any more (once lost, lost until a
    /// restart: a file put back meanwhile may not hold what was written).
    lost: Mutex<Option<String>>,
}

/// How to open the store at start.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// PostgreSQL URL; SQLite in the data directory without one.
    pub database_url: Option<String>,
    /// Accept the database as found (a new one if missing or empty) even
    /// though the data directory says another store was there, or instance
    /// processes of this data directory still run.
    pub reinitialise: bool,
    /// Pids of instance processes of this data directory that run now.
    pub running_instances: Vec<u32>,
}

/// The data directory's record of its store's install id.
const MARKER: &str = "store-id";

const SCHEMA_SQLITE: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS docs (kind TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, service TEXT NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_service ON events (service, seq);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (service TEXT NOT NULL, region TEXT NOT NULL, step INTEGER NOT NULL, t INTEGER NOT NULL, requests INTEGER NOT NULL, bytes INTEGER NOT NULL, hits INTEGER NOT NULL, lookups INTEGER NOT NULL, samples INTEGER NOT NULL, instances REAL NOT NULL, load REAL NOT NULL, mos_est REAL NOT NULL, mos_est_n INTEGER NOT NULL, mos_rep REAL NOT NULL, mos_rep_n INTEGER NOT NULL, cost REAL NOT NULL, PRIMARY KEY (service, region, step, t));
CREATE INDEX IF NOT EXISTS series_age ON series (step, t);
";

const SCHEMA_POSTGRES: &str = "
CREATE TABLE IF NOT EXISTS docs (kind TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS events (seq BIGSERIAL PRIMARY KEY, service TEXT NOT NULL, at_ms BIGINT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_service ON events (service, seq);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (service TEXT NOT NULL, region TEXT NOT NULL, step BIGINT NOT NULL, t BIGINT NOT NULL, requests BIGINT NOT NULL, bytes BIGINT NOT NULL, hits BIGINT NOT NULL, lookups BIGINT NOT NULL, samples BIGINT NOT NULL, instances DOUBLE PRECISION NOT NULL, load DOUBLE PRECISION NOT NULL, mos_est DOUBLE PRECISION NOT NULL, mos_est_n BIGINT NOT NULL, mos_rep DOUBLE PRECISION NOT NULL, mos_rep_n BIGINT NOT NULL, cost DOUBLE PRECISION NOT NULL, PRIMARY KEY (service, region, step, t));
CREATE INDEX IF NOT EXISTS series_age ON series (step, t);
";

fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

impl Store {
    /// The store of `data_dir`, checked against the data directory's
    /// marker: a store created here before must still be there.
    pub async fn open(data_dir: &Path, o: &OpenOptions) -> Result<Store, StoreError> {
        let db = match &o.database_url {
            Some(url) => Db::postgres(url).await?,
            None => Db::sqlite(data_dir)?,
        };
        let marker_path = data_dir.join(MARKER);
        let marker = std::fs::read_to_string(&marker_path)
            .ok()
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty());
        let found = db.meta("install_id").await?;
        let docs = db.count_docs().await?;
        let what = match &o.database_url {
            Some(_) => "the PostgreSQL database".to_string(),
            None => format!("{}", data_dir.join("vcdn.sqlite").display()),
        };
        let refuse = |m: String| {
            Err(StoreError::Refused(format!(
                "{m}; start with --reinitialise-store to accept {what} as it is (instances no record owns are then stopped)"
            )))
        };
        let install_id = match (found, &marker) {
            (Some(id), Some(m)) if *m != id && !o.reinitialise => {
                return refuse(format!(
                    "{what} is install {id}, but this data directory's store is install {m}: the database was replaced"
                ))
            }
            (Some(id), _) => id,
            (None, Some(m)) if !o.reinitialise => {
                return refuse(format!(
                    "this data directory had a store (install {m}), but {what} is missing or empty"
                ))
            }
            (None, None) if docs == 0 && !o.running_instances.is_empty() && !o.reinitialise => {
                return refuse(format!(
                    "{what} is new, but {} cache instances of this data directory still run (pids {:?}): their records are gone",
                    o.running_instances.len(),
                    o.running_instances
                ))
            }
            (None, _) => {
                // New, or written before stores had an identity.
                let id = format!("st-{}", crate::control::random_hex(8));
                db.set_meta("install_id", &id).await?;
                tracing::info!(install_id = %id, documents = docs, "store identity created");
                id
            }
        };
        if marker.as_deref() != Some(install_id.as_str()) {
            std::fs::write(&marker_path, format!("{install_id}\n"))
                .map_err(|e| StoreError::Io(marker_path.clone(), e))?;
        }
        let file = match &db {
            Db::Sqlite(_) => {
                let p = data_dir.join("vcdn.sqlite");
                let id = file_id(&p).map_err(|e| StoreError::Io(p.clone(), e))?;
                Some((p, id))
            }
            Db::Postgres(_) => None,
        };
        Ok(Store {
            db,
            install_id,
            file,
            lost: Mutex::new(None),
        })
    }

    pub fn engine(&self) -> &'static str {
        match self.db {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgresql",
        }
    }

    /// The id written when this store was created.
    pub fn install_id(&self) -> &str {
        &self.install_id
    }

    /// Whether the store is still the one opened; why not, if not.
    pub async fn health(&self) -> Result<(), StoreError> {
        self.check().await
    }

    /// Checks, before each operation, that the database is the one opened.
    async fn check(&self) -> Result<(), StoreError> {
        if let Some(why) = self.lost.lock().clone() {
            return Err(StoreError::Lost(why));
        }
        let why = match &self.file {
            Some((path, id)) => match file_id(path) {
                Err(_) => Some(format!("the database file {} was removed", path.display())),
                Ok(now) if now != *id => Some(format!(
                    "the database file {} was replaced by another file",
                    path.display()
                )),
                Ok(_) => None,
            },
            None => None,
        };
        let why = match why {
            Some(w) => Some(w),
            None => match self.db.meta("install_id").await? {
                Some(id) if id == self.install_id => None,
                Some(id) => Some(format!(
                    "the database is now install {id}, not {}: it was replaced",
                    self.install_id
                )),
                None => Some(format!(
                    "the database no longer holds install id {}: it was emptied or replaced",
                    self.install_id
                )),
            },
        };
        let Some(why) = why else {
            return Ok(());
        };
        let mut lost = self.lost.lock();
        if lost.is_none() {
            tracing::error!(reason = %why, "the store was removed or replaced while running; refusing writes");
            *lost = Some(why.clone());
        }
        Err(StoreError::Lost(why))
    }

    pub async fn put<T: Serialize>(&self, kind: &str, id: &str, v: &T) -> Result<(), StoreError> {
        let body = serde_json::to_string(v).expect("resources serialize");
        self.check().await?;
        match &self.db {
            Db::Sqlite(c) => {
                c.lock().execute(
                    "INSERT INTO docs (kind, id, body) VALUES (?1, ?2, ?3) ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body",
                    (kind, id, &body),
                )?;
            }
            Db::Postgres(c) => {
                c.execute(
                    "INSERT INTO docs (kind, id, body) VALUES ($1, $2, $3) ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body",
                    &[&kind, &id, &body],
                )
                .await?;
            }
        }
        Ok(())
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        self.check().await?;
        let body: Option<String> = match &self.db {
            Db::Sqlite(c) => {
                let c = c.lock();
                let mut st =
                    c.prepare_cached("SELECT body FROM docs WHERE kind = ?1 AND id = ?2")?;
                let mut rows = st.query((kind, id))?;
                match rows.next()? {
                    Some(r) => Some(r.get(0)?),
                    None => None,
                }
            }
            Db::Postgres(c) => c
                .query_opt(
                    "SELECT body FROM docs WHERE kind = $1 AND id = $2",
                    &[&kind, &id],
                )
                .await?
                .map(|r| r.get(0)),
        };
        body.map(|b| {
            serde_json::from_str(&b).map_err(|e| StoreError::Corrupt(kind.into(), id.into(), e))
        })
        .transpose()
    }

    /// Every document of a kind, by id.
    pub async fn list<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<T>, StoreError> {
        self.check().await?;
        let rows: Vec<(String, String)> = match &self.db {
            Db::Sqlite(c) => {
                let c = c.lock();
                let mut st =
                    c.prepare_cached("SELECT id, body FROM docs WHERE kind = ?1 ORDER BY id")?;
                let rows = st.query_map([kind], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<Result<_, _>>()?
            }
            Db::Postgres(c) => c
                .query(
                    "SELECT id, body FROM docs WHERE kind = $1 ORDER BY id",
                    &[&kind],
                )
                .await?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
        };
        rows.into_iter()
            .map(|(id, b)| {
                serde_json::from_str(&b).map_err(|e| StoreError::Corrupt(kind.into(), id, e))
            })
            .collect()
    }

    /// Whether it was there.
    pub async fn delete(&self, kind: &str, id: &str) -> Result<bool, StoreError> {
        self.check().await?;
        Ok(match &self.db {
            Db::Sqlite(c) => {
                c.lock()
                    .execute("DELETE FROM docs WHERE kind = ?1 AND id = ?2", (kind, id))?
                    > 0
            }
            Db::Postgres(c) => {
                c.execute(
                    "DELETE FROM docs WHERE kind = $1 AND id = $2",
                    &[&kind, &id],
                )
                .await?
                    > 0
            }
        })
    }

    pub async fn add_event(
        &self,
        service: &str,
        at_ms: u64,
        kind: &str,
        detail: &str,
    ) -> Result<i64, StoreError> {
        let at = at_ms as i64;
        self.check().await?;
        Ok(match &self.db {
            Db::Sqlite(c) => {
                let c = c.lock();
                c.execute(
                    "INSERT INTO events (service, at_ms, kind, detail) VALUES (?1, ?2, ?3, ?4)",
                    (service, at, kind, detail),
                )?;
                c.last_insert_rowid()
            }
            Db::Postgres(c) => c
                .query_one(
                    "INSERT INTO events (service, at_ms, kind, detail) VALUES ($1, $2, $3, $4) RETURNING seq",
                    &[&service, &at, &kind, &detail],
                )
                .await?
                .get(0),
        })
    }

    /// A service's events after `after` (a sequence number), oldest first.
    pub async fn events(&self, service: &str, after: i64) -> Result<Vec<Event>, StoreError> {
        let row = |service: String, seq: i64, at: i64, kind: String, detail: String| Event {
            seq,
            service,
            at_ms: at.max(0) as u64,
            kind,
            detail,
        };
        self.check().await?;
        Ok(match &self.db {
            Db::Sqlite(c) => {
                let c = c.lock();
                let mut st = c.prepare_cached(
                    "SELECT seq, at_ms, kind, detail FROM events WHERE service = ?1 AND seq > ?2 ORDER BY seq LIMIT 10000",
                )?;
                let rows = st.query_map((service, after), |r| {
                    Ok(row(service.to_string(), r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
                rows.collect::<Result<_, _>>()?
            }
            Db::Postgres(c) => c
                .query(
                    "SELECT seq, at_ms, kind, detail FROM events WHERE service = $1 AND seq > $2 ORDER BY seq LIMIT 10000",
                    &[&service, &after],
                )
                .await?
                .into_iter()
                .map(|r| row(service.to_string(), r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect(),
        })
    }

    /// Adds a step's points to the time series (`crate::timeseries`):
    /// counters and gauge sums add to what a bucket holds, the cost keeps
    /// its highest value; then drops what each resolution no longer keeps.
    /// One transaction, so a crash leaves whole steps.
    pub async fn series_add(
        &self,
        points: &[crate::timeseries::Point],
        prune: &[(u64, u64)],
    ) -> Result<(), StoreError> {
        const COLS: &str = "service, region, step, t, requests, bytes, hits, lookups, samples, instances, load, mos_est, mos_est_n, mos_rep, mos_rep_n, cost";
        const ADD: &str = "requests = series.requests + excluded.requests, bytes = series.bytes + excluded.bytes, hits = series.hits + excluded.hits, lookups = series.lookups + excluded.lookups, samples = series.samples + excluded.samples, instances = series.instances + excluded.instances, load = series.load + excluded.load, mos_est = series.mos_est + excluded.mos_est, mos_est_n = series.mos_est_n + excluded.mos_est_n, mos_rep = series.mos_rep + excluded.mos_rep, mos_rep_n = series.mos_rep_n + excluded.mos_rep_n";
        let i = |v: u64| v.min(i64::MAX as u64) as i64;
        self.check().await?;
        match &self.db {
            Db::Sqlite(c) => {
                let mut c = c.lock();
                let tx = c.transaction()?;
                {
                    let mut st = tx.prepare_cached(&format!(
                        "INSERT INTO series ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) \
                         ON CONFLICT (service, region, step, t) DO UPDATE SET {ADD}, cost = max(series.cost, excluded.cost)"
                    ))?;
                    for p in points {
                        let a = &p.acc;
                        st.execute(rusqlite::params![
                            p.service,
                            p.region,
                            i(p.step),
                            i(p.t),
                            i(a.requests),
                            i(a.bytes),
                            i(a.hits),
                            i(a.lookups),
                            i(a.samples),
                            a.instances,
                            a.load,
                            a.mos_est,
                            i(a.mos_est_n),
                            a.mos_rep,
                            i(a.mos_rep_n),
                            a.cost
                        ])?;
                    }
                    for (step, before) in prune {
                        tx.execute(
                            "DELETE FROM series WHERE step = ?1 AND t < ?2",
                            (i(*step), i(*before)),
                        )?;
                    }
                }
                tx.commit()?;
            }
            Db::Postgres(c) => {
                let sql = format!(
                    "INSERT INTO series ({COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                     ON CONFLICT (service, region, step, t) DO UPDATE SET {ADD}, cost = GREATEST(series.cost, excluded.cost)"
                );
                c.batch_execute("BEGIN").await?;
                let r: Result<(), tokio_postgres::Error> = async {
                    let st = c.prepare(&sql).await?;
                    for p in points {
                        let a = &p.acc;
                        c.execute(
                            &st,
                            &[
                                &p.service,
                                &p.region,
                                &i(p.step),
                                &i(p.t),
                                &i(a.requests),
                                &i(a.bytes),
                                &i(a.hits),
                                &i(a.lookups),
                                &i(a.samples),
                                &a.instances,
                                &a.load,
                                &a.mos_est,
                                &i(a.mos_est_n),
                                &a.mos_rep,
                                &i(a.mos_rep_n),
                                &a.cost,
                            ],
                        )
                        .await?;
                    }
                    for (step, before) in prune {
                        c.execute(
                            "DELETE FROM series WHERE step = $1 AND t < $2",
                            &[&i(*step), &i(*before)],
                        )
                        .await?;
                    }
                    Ok(())
                }
                .await;
                match r {
                    Ok(()) => c.batch_execute("COMMIT").await?,
                    Err(e) => {
                        let _ = c.batch_execute("ROLLBACK").await;
                        return Err(e.into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The points of one resolution with `from <= t < to`: of one service,
    /// or summed over every service per region (`None`, the platform).
    pub async fn series(
        &self,
        service: Option<&str>,
        step: u64,
        from: u64,
        to: u64,
    ) -> Result<Vec<crate::timeseries::Point>, StoreError> {
        use crate::timeseries::{Accumulator, Point};
        let i = |v: u64| v.min(i64::MAX as u64) as i64;
        let u = |v: i64| v.max(0) as u64;
        let sums = "SUM(requests), SUM(bytes), SUM(hits), SUM(lookups), SUM(samples), SUM(instances), SUM(load), SUM(mos_est), SUM(mos_est_n), SUM(mos_rep), SUM(mos_rep_n), SUM(cost)";
        let filter = if service.is_some() {
            "service = {S} AND "
        } else {
            ""
        };
        let sql = |ph: [&str; 4]| {
            format!(
                "SELECT region, t, {sums} FROM series WHERE {}step = {} AND t >= {} AND t < {} GROUP BY region, t ORDER BY region, t LIMIT 200000",
                filter.replace("{S}", ph[0]),
                ph[1],
                ph[2],
                ph[3]
            )
        };
        let name = service.unwrap_or("").to_string();
        let point =
            |region: String, t: i64, n: [i64; 5], f: [f64; 4], m: [i64; 2], cost: f64| Point {
                service: name.clone(),
                region,
                step,
                t: u(t),
                acc: Accumulator {
                    requests: u(n[0]),
                    bytes: u(n[1]),
                    hits: u(n[2]),
                    lookups: u(n[3]),
                    samples: u(n[4]),
                    instances: f[0],
                    load: f[1],
                    mos_est: f[2],
                    mos_est_n: u(m[0]),
                    mos_rep: f[3],
                    mos_rep_n: u(m[1]),
                    cost,
                },
            };
        self.check().await?;
        Ok(match &self.db {
            Db::Sqlite(c) => {
                let c = c.lock();
                let q = match service {
                    Some(_) => sql(["?1", "?2", "?3", "?4"]),
                    None => sql(["", "?1", "?2", "?3"]),
                };
                let mut st = c.prepare_cached(&q)?;
                let map = |r: &rusqlite::Row| {
                    Ok(point(
                        r.get(0)?,
                        r.get(1)?,
                        [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?],
                        [r.get(7)?, r.get(8)?, r.get(9)?, r.get(11)?],
                        [r.get(10)?, r.get(12)?],
                        r.get(13)?,
                    ))
                };
                let rows = match service {
                    Some(s) => st.query_map(rusqlite::params![s, i(step), i(from), i(to)], map)?,
                    None => st.query_map(rusqlite::params![i(step), i(from), i(to)], map)?,
                };
                rows.collect::<Result<_, _>>()?
            }
            Db::Postgres(c) => {
                // SUM of BIGINT is NUMERIC in PostgreSQL: cast back.
                let q = match service {
                    Some(_) => sql(["$1", "$2", "$3", "$4"]),
                    None => sql(["", "$1", "$2", "$3"]),
                };
                let q = cast_sums(&q.replace("SUM(", "SUM_("));
                let (a, b, d) = (i(step), i(from), i(to));
                let rows = match service {
                    Some(s) => c.query(&q, &[&s, &a, &b, &d]).await?,
                    None => c.query(&q, &[&a, &b, &d]).await?,
                };
                rows.into_iter()
                    .map(|r| {
                        point(
                            r.get(0),
                            r.get(1),
                            [r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)],
                            [r.get(7), r.get(8), r.get(9), r.get(11)],
                            [r.get(10), r.get(12)],
                            r.get(13),
                        )
                    })
                    .collect()
            }
        })
    }
}

/// PostgreSQL's SUM of a BIGINT is NUMERIC: each `SUM_(col)` becomes
/// `SUM(col)::BIGINT` for integer columns and `SUM(col)` for the others.
fn cast_sums(q: &str) -> String {
    const INTS: [&str; 7] = [
        "requests",
        "bytes",
        "hits",
        "lookups",
        "samples",
        "mos_est_n",
        "mos_rep_n",
    ];
    let mut out = q.to_string();
    for c in INTS {
        out = out.replace(&format!("SUM_({c})"), &format!("SUM({c})::BIGINT"));
    }
    out.replace("SUM_(", "SUM(")
}

impl Db {
    fn sqlite(dir: &Path) -> Result<Db, StoreError> {
        let conn = rusqlite::Connection::open(dir.join("vcdn.sqlite"))?;
        conn.execute_batch(SCHEMA_SQLITE)?;
        Ok(Db::Sqlite(Mutex::new(conn)))
    }

    /// A PostgreSQL database, e.g. `postgresql://vcdn@127.0.0.1:5432/vcdn`.
    async fn postgres(url: &str) -> Result<Db, StoreError> {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::error!(error = %e, "PostgreSQL connection lost");
            }
        });
        client.batch_execute(SCHEMA_POSTGRES).await?;
        Ok(Db::Postgres(client))
    }

    async fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(match self {
            Db::Sqlite(c) => {
                let c = c.lock();
                let mut st = c.prepare_cached("SELECT value FROM meta WHERE key = ?1")?;
                let mut rows = st.query([key])?;
                match rows.next()? {
                    Some(r) => Some(r.get(0)?),
                    None => None,
                }
            }
            Db::Postgres(c) => c
                .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
                .await?
                .map(|r| r.get(0)),
        })
    }

    async fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        match self {
            Db::Sqlite(c) => {
                c.lock().execute(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )?;
            }
            Db::Postgres(c) => {
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    &[&key, &value],
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn count_docs(&self) -> Result<i64, StoreError> {
        Ok(match self {
            Db::Sqlite(c) => c
                .lock()
                .query_row("SELECT COUNT(*) FROM docs", [], |r| r.get(0))?,
            Db::Postgres(c) => c.query_one("SELECT COUNT(*) FROM docs", &[]).await?.get(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sqlite_keeps_documents_and_events_across_reopening() {
        let dir = std::env::temp_dir().join(format!("vcdn-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        {
            let s = Store::open(&dir, &OpenOptions::default()).await.unwrap();
            s.put("thing", "b", &serde_json::json!({"n": 2}))
                .await
                .unwrap();
            s.put("thing", "a", &serde_json::json!({"n": 1}))
                .await
                .unwrap();
            s.put("thing", "a", &serde_json::json!({"n": 3}))
                .await
                .unwrap();
            assert_eq!(s.add_event("svc", 5, "deployed", "ok").await.unwrap(), 1);
            assert_eq!(s.add_event("svc", 6, "healed", "pid 1").await.unwrap(), 2);
        }
        let s = Store::open(&dir, &OpenOptions::default()).await.unwrap();
        let all: Vec<serde_json::Value> = s.list("thing").await.unwrap();
        assert_eq!(
            all,
            vec![serde_json::json!({"n": 3}), serde_json::json!({"n": 2})]
        );
        assert!(s.delete("thing", "a").await.unwrap());
        assert!(!s.delete("thing", "a").await.unwrap());
        assert_eq!(
            s.get::<serde_json::Value>("thing", "a").await.unwrap(),
            None
        );
        let ev = s.events("svc", 1).await.unwrap();
        assert_eq!(
            (ev.len(), ev[0].kind.as_str(), ev[0].at_ms),
            (1, "healed", 6)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Time series add into the buckets already stored (a restart adds,
    /// never replaces), keep the highest cost, sum services per region for
    /// the platform, and drop what a resolution no longer keeps.
    #[tokio::test]
    async fn sqlite_series_add_up_prune_and_sum_across_services() {
        use crate::timeseries::{Accumulator, Point};
        let dir = std::env::temp_dir().join(format!("vcdn-series-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open(&dir, &OpenOptions::default()).await.unwrap();
        let p = |service: &str, t: u64, requests: u64, cost: f64| Point {
            service: service.into(),
            region: "paris".into(),
            step: 10,
            t,
            acc: Accumulator {
                requests,
                samples: 1,
                instances: 2.0,
                cost,
                ..Default::default()
            },
        };
        s.series_add(&[p("a", 100, 5, 1.0), p("b", 100, 7, 0.5)], &[])
            .await
            .unwrap();
        s.series_add(&[p("a", 100, 3, 0.8), p("a", 110, 1, 2.0)], &[])
            .await
            .unwrap();
        let a = s.series(Some("a"), 10, 0, 1000).await.unwrap();
        let got: Vec<(u64, u64, u64, f64, f64)> = a
            .iter()
            .map(|p| {
                (
                    p.t,
                    p.acc.requests,
                    p.acc.samples,
                    p.acc.instances,
                    p.acc.cost,
                )
            })
            .collect();
        assert_eq!(got, [(100, 8, 2, 4.0, 1.0), (110, 1, 1, 2.0, 2.0)]);
        let all = s.series(None, 10, 100, 110).await.unwrap();
        assert_eq!(
            (all.len(), all[0].acc.requests),
            (1, 15),
            "a and b summed, t < 110"
        );
        s.series_add(&[], &[(10, 110)]).await.unwrap();
        assert_eq!(
            s.series(Some("a"), 10, 0, 1000).await.unwrap().len(),
            1,
            "t 100 pruned"
        );
        assert!(s.series(Some("a"), 300, 0, 1000).await.unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
