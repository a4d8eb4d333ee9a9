//! The renewer's memory and its clocks.

use super::*;

/// At 100,000 grants each byte of an entry is 100 KB of the sidecar (136 bytes a
/// grant before the keys were shared and the entry kept only what a renewal reads,
/// plus about 100 in two maps before the schedule kept the entries in groups).
#[test]
fn an_entry_stays_small() {
    assert!(size_of::<Entry>() <= 80, "{} bytes", size_of::<Entry>());
}

#[tokio::test(start_paused = true)]
async fn clocks_round_trip_instants() {
    let t = Instant::now() + Duration::from_millis(1500);
    let clock = LeaseClock::new(t);
    assert_eq!(clock.get(), t);
}

#[tokio::test(start_paused = true)]
async fn a_released_clock_takes_no_extension() {
    let t = Instant::now() + Duration::from_secs(1);
    let clock = LeaseClock::new(t);
    assert!(clock.extend(t + Duration::from_secs(1)));
    assert_eq!(clock.get(), t + Duration::from_secs(1));
    clock.release();
    // A renewal that lands after the release cannot make the grant live again.
    assert!(!clock.extend(t + Duration::from_secs(2)));
    assert!(clock.released());
}
