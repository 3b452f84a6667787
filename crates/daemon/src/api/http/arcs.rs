//! The arcs of a ketama pool's ring, for a controller that places them with bounded loads:
//! `GET /api/v1/pool/arcs` gives the requests routed on each arc so far and the server each
//! arc goes to; `PUT /api/v1/pool/placement` gives arcs to servers other than their ketama
//! owners (made for the ring over the servers it names, and kept for the points still on the
//! ring when it changes); `DELETE /api/v1/pool/placement` puts every arc back with its ketama
//! owner.

use super::*;
use switch::pool::{Placement, PlacementError};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PoolQuery {
    pool: Option<String>,
}

/// `GET /api/v1/pool/arcs`.
pub(super) async fn arcs(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let which: PoolQuery = query_args(query.as_deref().unwrap_or(""))?;
    let pool = pool_named(&api, which.pool.as_deref())?;
    let spec = pool.spec();
    let view = pool.view(kvio::clock::now());
    let Some(arcs) = view.arcs() else {
        return Err(ControlError::new(
            ErrorKind::Conflict,
            "pool",
            PlacementError::NotKetama.to_string(),
        )
        .into());
    };
    // Counted from the first time they are asked for.
    arcs.start();
    let weights: Vec<u32> = view.ring_servers(&spec).iter().map(|(_, w)| *w).collect();
    let owners = view.ring_owners();
    ok(json!({
        "pool": spec.name,
        "version": view.version(),
        "servers": arcs.servers(),
        "weights": weights,
        "points": arcs.len(),
        "values": arcs.values(),
        "placed": view.placed(),
        "counts": arcs.counts(),
        "owners": owners,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetPlacement {
    pool: Option<String>,
    /// The ring's servers (ring names, in the pool's order) the placement was made for.
    servers: Vec<String>,
    /// Points on that ring.
    points: usize,
    /// (point value, server's ring name) for each arc not left with its ketama owner.
    moves: Vec<(u32, String)>,
}

fn placement_failure(e: PlacementError) -> ApiFailure {
    let (kind, field) = match e {
        PlacementError::NotKetama | PlacementError::OtherRing { .. } => {
            (ErrorKind::Conflict, "servers")
        }
        PlacementError::Points { .. } => (ErrorKind::Conflict, "points"),
        PlacementError::TooMany { .. } => (ErrorKind::Invalid, "moves"),
        PlacementError::NoSuchPoint(_) | PlacementError::UnknownServer(_) => {
            (ErrorKind::Invalid, "moves")
        }
    };
    ControlError::new(kind, field, e.to_string()).into()
}

/// `PUT /api/v1/pool/placement`.
pub(super) async fn set(State(api): State<Shared>, bytes: Bytes) -> Reply {
    let p: SetPlacement = body(&bytes)?;
    let pool = pool_named(&api, p.pool.as_deref())?;
    let moved = p.moves.len();
    let version = pool
        .set_placement(Some(Placement {
            servers: p.servers,
            points: p.points,
            moves: p.moves,
        }))
        .map_err(placement_failure)?;
    ok(json!({ "version": version, "moved": moved }))
}

/// `DELETE /api/v1/pool/placement`.
pub(super) async fn clear(State(api): State<Shared>, RawQuery(query): RawQuery) -> Reply {
    let which: PoolQuery = query_args(query.as_deref().unwrap_or(""))?;
    let pool = pool_named(&api, which.pool.as_deref())?;
    let version = pool.set_placement(None).map_err(placement_failure)?;
    ok(json!({ "version": version }))
}
