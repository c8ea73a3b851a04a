"""The words of the hosted preference page in each language it speaks, chosen for a user's
locale by the same lookup templates use (``schemas/locales.py``), English when none fits."""

from __future__ import annotations

from typing import Final

from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.locales import best_variant

DEFAULT: Final = "en"

TEXT: Final[dict[str, dict[str, str]]] = {
    "en": {
        "title": "Notification preferences",
        "intro": "Choose what we may send you, and how.",
        "required": "Sign-in codes and security alerts are always sent.",
        "save": "Save",
        "saved": "Your preferences are saved.",
        "no_channels": "We have no way to reach you yet.",
        "gone": "This link no longer works. Ask for a new one.",
        "cat.transactional": "Orders and activity",
        "cat.account": "Your account",
        "cat.marketing": "News and offers",
        "ch.SMS": "Text message", "ch.EMAIL": "Email", "ch.PUSH": "Phone notification",
        "ch.CHAT": "Team chat", "ch.INAPP": "In the app",
        "topics": "Topics you follow (unticked: you hear nothing from it)",
        "too_many": "Too many muted topics: nothing was saved.",
    },
    "fr": {
        "title": "Préférences de notification",
        "intro": "Choisissez ce que nous pouvons vous envoyer, et comment.",
        "required": "Les codes de connexion et les alertes de sécurité sont toujours envoyés.",
        "save": "Enregistrer",
        "saved": "Vos préférences sont enregistrées.",
        "no_channels": "Nous n'avons encore aucun moyen de vous joindre.",
        "gone": "Ce lien ne fonctionne plus. Demandez-en un nouveau.",
        "cat.transactional": "Commandes et activité",
        "cat.account": "Votre compte",
        "cat.marketing": "Actualités et offres",
        "ch.SMS": "SMS", "ch.EMAIL": "E-mail", "ch.PUSH": "Notification sur le téléphone",
        "ch.CHAT": "Messagerie d'équipe", "ch.INAPP": "Dans l'application",
        "topics": "Sujets suivis (décoché : vous n'en recevez rien)",
        "too_many": "Trop de sujets en sourdine : rien n'a été enregistré.",
    },
    "de": {
        "title": "Benachrichtigungseinstellungen",
        "intro": "Wählen Sie, was wir Ihnen senden dürfen und wie.",
        "required": "Anmeldecodes und Sicherheitswarnungen werden immer gesendet.",
        "save": "Speichern",
        "saved": "Ihre Einstellungen sind gespeichert.",
        "no_channels": "Wir können Sie noch auf keinem Weg erreichen.",
        "gone": "Dieser Link funktioniert nicht mehr. Fordern Sie einen neuen an.",
        "cat.transactional": "Bestellungen und Aktivität",
        "cat.account": "Ihr Konto",
        "cat.marketing": "Neuigkeiten und Angebote",
        "ch.SMS": "SMS", "ch.EMAIL": "E-Mail", "ch.PUSH": "Benachrichtigung auf dem Telefon",
        "ch.CHAT": "Team-Chat", "ch.INAPP": "In der App",
        "topics": "Themen, denen Sie folgen (nicht angehakt: Sie erhalten nichts dazu)",
        "too_many": "Zu viele stummgeschaltete Themen: nichts wurde gespeichert.",
    },
    "es": {
        "title": "Preferencias de notificación",
        "intro": "Elija qué podemos enviarle y cómo.",
        "required": "Los códigos de acceso y las alertas de seguridad se envían siempre.",
        "save": "Guardar",
        "saved": "Sus preferencias se han guardado.",
        "no_channels": "Aún no tenemos forma de contactarle.",
        "gone": "Este enlace ya no funciona. Pida uno nuevo.",
        "cat.transactional": "Pedidos y actividad",
        "cat.account": "Su cuenta",
        "cat.marketing": "Novedades y ofertas",
        "ch.SMS": "SMS", "ch.EMAIL": "Correo electrónico", "ch.PUSH": "Notificación en el móvil",
        "ch.CHAT": "Chat de equipo", "ch.INAPP": "En la aplicación",
        "topics": "Temas que sigue (sin marcar: no recibe nada de ellos)",
        "too_many": "Demasiados temas silenciados: no se ha guardado nada.",
    },
}


def page_language(locale: str | None) -> str:
    """The page's language for a user's ``locale`` (canonical tag or None)."""
    return best_variant(TEXT.keys(), locale) or DEFAULT


def words(language: str) -> dict[str, str]:
    return TEXT.get(language, TEXT[DEFAULT])


def category_label(language: str, category: Category) -> str:
    return words(language)[f"cat.{category.value}"]


def channel_label(language: str, channel: Channel) -> str:
    return words(language)[f"ch.{channel.value}"]
