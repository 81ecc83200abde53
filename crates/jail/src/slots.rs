//! Slot bookkeeping. A slot is a uid range plus a directory; it is *reserved* while a start is
//! in flight and *taken* while a sandbox (started or adopted) holds it.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState<T> {
    Reserved,
    Taken(T),
}

#[derive(Debug)]
pub struct SlotTable<T> {
    max: u32,
    slots: BTreeMap<u32, SlotState<T>>,
}

impl<T> SlotTable<T> {
    pub fn new(max: u32) -> Self {
        SlotTable {
            max,
            slots: BTreeMap::new(),
        }
    }

    /// Reserve the lowest free slot. `foreign` says whether a slot is held by a live sandbox
    /// this table does not know (one a previous server run started and nobody adopted yet);
    /// such slots are skipped so adoption can still succeed.
    pub fn reserve(&mut self, mut foreign: impl FnMut(u32) -> bool) -> Option<u32> {
        let n = (0..self.max).find(|n| !self.slots.contains_key(n) && !foreign(*n))?;
        self.slots.insert(n, SlotState::Reserved);
        Some(n)
    }

    /// Reserve a specific slot if it is free (cleanup of a slot nobody holds).
    pub fn reserve_at(&mut self, n: u32) -> bool {
        if n >= self.max || self.slots.contains_key(&n) {
            return false;
        }
        self.slots.insert(n, SlotState::Reserved);
        true
    }

    /// Take a specific slot (adoption, or completing a reservation).
    pub fn take(&mut self, n: u32, value: T) -> Result<(), &SlotState<T>> {
        if n >= self.max {
            return Err(&SlotState::Reserved);
        }
        match self.slots.get(&n) {
            Some(SlotState::Taken(_)) => Err(self.slots.get(&n).expect("present")),
            _ => {
                self.slots.insert(n, SlotState::Taken(value));
                Ok(())
            }
        }
    }

    pub fn get(&self, n: u32) -> Option<&SlotState<T>> {
        self.slots.get(&n)
    }

    pub fn taken(&self, n: u32) -> Option<&T> {
        match self.slots.get(&n) {
            Some(SlotState::Taken(v)) => Some(v),
            _ => None,
        }
    }

    pub fn free(&mut self, n: u32) -> Option<SlotState<T>> {
        self.slots.remove(&n)
    }

    pub fn is_busy(&self, n: u32) -> bool {
        self.slots.contains_key(&n)
    }

    pub fn iter_taken(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().filter_map(|(n, s)| match s {
            SlotState::Taken(v) => Some((*n, v)),
            SlotState::Reserved => None,
        })
    }

    pub fn max(&self) -> u32 {
        self.max
    }
}

/// Host uid (and gid) of a slot's root.
pub fn slot_uid(uid_base: u32, slot: u32) -> u32 {
    uid_base + slot * crate::IDS_PER_SLOT
}

/// Does `max_slots` ranges from `uid_base` fit below the invalid uid (u32::MAX)?
pub fn uid_range_fits(uid_base: u32, max_slots: u32) -> bool {
    u64::from(uid_base) + u64::from(max_slots) * u64::from(crate::IDS_PER_SLOT)
        < u64::from(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_slot_is_reserved_and_reused_after_free() {
        let mut t: SlotTable<&str> = SlotTable::new(3);
        assert_eq!(t.reserve(|_| false), Some(0));
        assert_eq!(t.reserve(|_| false), Some(1));
        t.take(1, "b").unwrap();
        assert_eq!(t.reserve(|_| false), Some(2));
        assert_eq!(t.reserve(|_| false), None, "table full");
        t.free(0);
        assert_eq!(t.reserve(|_| false), Some(0));
        assert_eq!(t.taken(1), Some(&"b"));
        assert_eq!(t.iter_taken().collect::<Vec<_>>(), vec![(1, &"b")]);
    }

    #[test]
    fn specific_reservations_only_take_free_slots() {
        let mut t: SlotTable<u8> = SlotTable::new(2);
        assert!(t.reserve_at(1));
        assert!(!t.reserve_at(1));
        assert!(!t.reserve_at(2));
        assert_eq!(t.reserve(|_| false), Some(0));
        assert_eq!(t.reserve(|_| false), None);
    }

    #[test]
    fn foreign_live_slots_are_skipped() {
        let mut t: SlotTable<()> = SlotTable::new(4);
        assert_eq!(t.reserve(|n| n < 2), Some(2));
    }

    #[test]
    fn take_refuses_taken_and_out_of_range_slots() {
        let mut t: SlotTable<u8> = SlotTable::new(2);
        t.take(0, 1).unwrap();
        assert!(t.take(0, 2).is_err());
        assert!(t.take(5, 2).is_err());
        // A reservation can be completed.
        let n = t.reserve(|_| false).unwrap();
        t.take(n, 3).unwrap();
        assert_eq!(t.taken(n), Some(&3));
    }

    #[test]
    fn uid_ranges() {
        assert_eq!(slot_uid(1_000_000, 0), 1_000_000);
        assert_eq!(slot_uid(1_000_000, 2), 1_131_072);
        assert!(uid_range_fits(1_000_000, 60_000));
        assert!(!uid_range_fits(1_000_000, 70_000));
    }
}
