//! The persistent store: SQLite in the data directory by default,
//! PostgreSQL when a URL is given. Resources are JSON documents by kind and
//! id (the API's own shapes, so both engines hold the same thing); events
//! are an append-only table.

use std::path::Path;

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
}

pub enum Store {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(tokio_postgres::Client),
}

const SCHEMA_SQLITE: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS docs (kind TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, service TEXT NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_service ON events (service, seq);
";

const SCHEMA_POSTGRES: &str = "
CREATE TABLE IF NOT EXISTS docs (kind TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE IF NOT EXISTS events (seq BIGSERIAL PRIMARY KEY, service TEXT NOT NULL, at_ms BIGINT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_service ON events (service, seq);
";

impl Store {
    /// `vcdn.sqlite` in `dir` (created if missing).
    pub fn sqlite(dir: &Path) -> Result<Store, StoreError> {
        let conn = rusqlite::Connection::open(dir.join("vcdn.sqlite"))?;
        conn.execute_batch(SCHEMA_SQLITE)?;
        Ok(Store::Sqlite(Mutex::new(conn)))
    }

    /// A PostgreSQL database, e.g. `postgresql://vcdn@127.0.0.1:5432/vcdn`.
    pub async fn postgres(url: &str) -> Result<Store, StoreError> {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::error!(error = %e, "PostgreSQL connection lost");
            }
        });
        client.batch_execute(SCHEMA_POSTGRES).await?;
        Ok(Store::Postgres(client))
    }

    pub fn engine(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgresql",
        }
    }

    pub async fn put<T: Serialize>(&self, kind: &str, id: &str, v: &T) -> Result<(), StoreError> {
        let body = serde_json::to_string(v).expect("resources serialize");
        match self {
            Store::Sqlite(c) => {
                c.lock().execute(
                    "INSERT INTO docs (kind, id, body) VALUES (?1, ?2, ?3) ON CONFLICT (kind, id) DO UPDATE SET body = excluded.body",
                    (kind, id, &body),
                )?;
            }
            Store::Postgres(c) => {
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
        let body: Option<String> = match self {
            Store::Sqlite(c) => {
                let c = c.lock();
                let mut st =
                    c.prepare_cached("SELECT body FROM docs WHERE kind = ?1 AND id = ?2")?;
                let mut rows = st.query((kind, id))?;
                match rows.next()? {
                    Some(r) => Some(r.get(0)?),
                    None => None,
                }
            }
            Store::Postgres(c) => c
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
        let rows: Vec<(String, String)> = match self {
            Store::Sqlite(c) => {
                let c = c.lock();
                let mut st =
                    c.prepare_cached("SELECT id, body FROM docs WHERE kind = ?1 ORDER BY id")?;
                let rows = st.query_map([kind], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<Result<_, _>>()?
            }
            Store::Postgres(c) => c
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
        Ok(match self {
            Store::Sqlite(c) => {
                c.lock()
                    .execute("DELETE FROM docs WHERE kind = ?1 AND id = ?2", (kind, id))?
                    > 0
            }
            Store::Postgres(c) => {
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
        Ok(match self {
            Store::Sqlite(c) => {
                let c = c.lock();
                c.execute(
                    "INSERT INTO events (service, at_ms, kind, detail) VALUES (?1, ?2, ?3, ?4)",
                    (service, at, kind, detail),
                )?;
                c.last_insert_rowid()
            }
            Store::Postgres(c) => c
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
        Ok(match self {
            Store::Sqlite(c) => {
                let c = c.lock();
                let mut st = c.prepare_cached(
                    "SELECT seq, at_ms, kind, detail FROM events WHERE service = ?1 AND seq > ?2 ORDER BY seq LIMIT 10000",
                )?;
                let rows = st.query_map((service, after), |r| {
                    Ok(row(service.to_string(), r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
                rows.collect::<Result<_, _>>()?
            }
            Store::Postgres(c) => c
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
            let s = Store::sqlite(&dir).unwrap();
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
        let s = Store::sqlite(&dir).unwrap();
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
}
