"""Who people are: signing in (the login page, django-axes' lockout, single sign-on
through django-allauth), and members' roles as the identity provider gives them, with
the hooks that act when a person is saved or leaves."""
