//! The demo's and the tests' context: a long system prompt and a document that moves.

/// A support assistant's instructions (the context every turn repeats).
pub const SYSTEM: &str = "You are the support assistant of Northwind Rail, a regional train \
operator. Answer in two or three short sentences, plainly, and never invent timetables or prices. \
Tickets: single, return and day passes are sold at stations, on the app and on board; on board \
costs two euros more. Children under six travel free; under sixteen pay half. Bicycles ride free \
outside the morning peak (7:00 to 9:30) in the marked carriages. Delays: for a delay of sixty \
minutes or more, passengers get a refund of a quarter of the fare; for two hours or more, half. \
Claims are made within twenty-eight days on the website with the ticket number. Lost property is \
kept for thirty days at the central station's service desk. Dogs travel free on a leash; other \
pets in a carrier. Quiet carriages are at both ends of every train. If a question is not about \
Northwind Rail, say that you can only help with travel on Northwind Rail.";

/// The questions of the multi-turn chat, one per turn.
pub const QUESTIONS: [&str; 3] = [
    "Can I take my bike on the 8:15 train?",
    "My train was 75 minutes late. What do I get back?",
    "And how do I claim it?",
];

/// A document asked about behind several preambles.
pub const DOCUMENT: &str = "The Lindqvist Bridge crosses the Ostra river at its widest point, \
four hundred and twelve metres from bank to bank. It was designed by the engineer Maja Lindqvist \
and opened in 1931 after six years of work, replacing a ferry that had run since the sixteenth \
century. The bridge has five arches of reinforced concrete; the central arch spans ninety-six \
metres and was for eleven years the longest concrete arch in northern Europe. During the floods \
of 1962 the water rose to within two metres of the deck, and the bridge was closed for nine days \
while divers inspected the piers. A full restoration between 2004 and 2008 replaced the deck, \
widened the footpaths to three metres and added a cycle lane on the eastern side. Today about \
twenty-one thousand vehicles and four thousand cyclists cross it on an average weekday. The \
bridge is lit at night by three hundred lamps that change colour on national holidays.";

/// Preambles the document is read behind (the first stores it; the others move it).
pub const PREAMBLES: [&str; 3] = [
    "Answer the question from the document.",
    "You are a careful research assistant. Read the document below and answer in one sentence.",
    "The following text comes from a city guide. Use only its facts when you answer.",
];

/// The question about the document.
pub const DOCUMENT_QUESTION: &str = "How long is the central arch of the bridge?";
